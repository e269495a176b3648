"""ELMo: character ids, the biLM against an independent numpy forward pass over a weights file in
the published layout, statelessness, clipping, loading errors, training and resuming, the encoder."""

from __future__ import annotations

import dataclasses
import json

import h5py
import numpy as np
import pytest
import torch
import typer
from typer.testing import CliRunner

from lmgeom.cli.elmo import register
from lmgeom.corpus import Corpus
from lmgeom.corpus.splits import brown_heldout_files, brown_split
from lmgeom.elmo import (
    ElmoBiLM, ElmoConfig, TrainConfig, batch_to_ids, load_elmo, perplexity, save_elmo,
    train, word_ids,
)
from lmgeom.elmo.chars import words_ids
from lmgeom.elmo.model import Highway, run_lstm
from lmgeom.encoders.elmo import ElmoEncoder, load_elmo_encoder
from lmgeom.stages import extract

SENTENCES = [
    ["The", "bank", "raised", "rates", "."],
    ["We", "sat", "on", "the", "bank", "of", "the", "river", "."],
    ["Rates", "fell"],
    ["Café", "naïve", "—", "ok"],
]
SMALL = ElmoConfig(
    filters=((1, 4), (2, 6), (3, 8)), char_embedding_dim=5, n_highway=2, lstm_dim=12, projection_dim=6, n_layers=2,
    cell_clip=0.5, proj_clip=0.4,
)


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def small_model(config: ElmoConfig = SMALL, *, seed: int = 0, **kwargs) -> ElmoBiLM:
    torch.manual_seed(seed)
    return ElmoBiLM(config, **kwargs).eval()


# ---- character ids -----------------------------------------------------------------------------

def test_word_ids_follow_the_published_convention():
    ids = word_ids("cat")
    assert ids.shape == (50,)
    assert ids[:5].tolist() == [259, ord("c") + 1, ord("a") + 1, ord("t") + 1, 260]
    assert (ids[5:] == 261).all()  # padding character 260, shifted
    assert word_ids("é")[:4].tolist() == [259, 0xC3 + 1, 0xA9 + 1, 260]  # UTF-8 bytes


def test_long_words_keep_48_bytes_even_mid_character():
    long = word_ids("x" * 60)
    assert long[1:49].tolist() == [ord("x") + 1] * 48 and long[49] == 260
    accented = word_ids("é" * 30)  # 60 bytes: cut after byte 48, the first half of a character
    assert (accented[1:49] - 1).astype(np.uint8).tobytes() == ("é" * 30).encode()[:48]
    assert np.array_equal(word_ids("x" * 48 + "yz"), word_ids("x" * 48 + "ab"))  # beyond 48 bytes is ignored


def test_sentence_boundaries_and_padding():
    ids = batch_to_ids([["a", "b"], []]).numpy()
    assert ids.shape == (2, 4, 50)
    assert ids[0, 0, :4].tolist() == [259, 257, 260, 261]  # <S>: bow, bos, eow, pad
    assert ids[0, 3, :4].tolist() == [259, 258, 260, 261]  # </S>: bow, eos, eow, pad
    assert ids[1, 1, :3].tolist() == [259, 258, 260]  # an empty sentence is <S> </S>
    assert (ids[1, 2:] == 0).all()  # positions without a token are all 0
    assert word_ids("<S>")[1] == ord("<") + 1  # a word spelled <S> is an ordinary word


def spelled_one_by_one(word: str, max_characters: int) -> list[int]:
    """The convention written out character by character: bow, bytes (at most max - 2), eow, padding; +1."""
    data = list(word.encode("utf-8"))[: max_characters - 2]
    ids = [258, *data, 259] + [260] * (max_characters - len(data) - 2)
    return [i + 1 for i in ids]


@pytest.mark.parametrize("max_characters", [3, 7, 50])
def test_words_spelled_together_equal_each_spelled_alone(max_characters):
    words = ["cat", "", "é", "naïve", "x" * 60, "é" * 30, "—", "<S>", "a b", "日本語", "cat"]
    ids = words_ids(words, max_characters)
    assert ids.dtype == np.int64 and ids.shape == (len(words), max_characters)
    assert ids.tolist() == [spelled_one_by_one(word, max_characters) for word in words]
    assert words_ids([], max_characters).shape == (0, max_characters)


def test_batch_ids_place_every_word_at_its_sentence_and_position():
    sentences = [["The", "bank"], [], ["Café", "naïve", "—", "ok", "The"]]
    ids = batch_to_ids(sentences, 9).numpy()
    for row, sentence in enumerate(sentences):
        for position, word in enumerate(sentence, start=1):
            assert ids[row, position].tolist() == spelled_one_by_one(word, 9)
        assert (ids[row, len(sentence) + 2 :] == 0).all()


# ---- modules -------------------------------------------------------------------------------------

def test_char_cnn_and_highway_shapes_and_formula():
    model = small_model()
    ids = batch_to_ids(SENTENCES)
    token = model.char_cnn(ids)
    assert token.shape == (4, 11, 6)
    highway = Highway(5)
    x = torch.randn(3, 5)
    gate = torch.sigmoid(x @ highway.carry.weight.T + highway.carry.bias)
    expected = gate * torch.relu(x @ highway.transform.weight.T + highway.transform.bias) + (1 - gate) * x
    torch.testing.assert_close(highway(x), expected)
    output = model(ids)
    assert output.layers().shape == (3, 4, 11, 12)


def test_lstm_clipping_clips_cell_and_projection():
    torch.manual_seed(1)
    lstm = torch.nn.LSTM(4, 10, proj_size=3, batch_first=True)
    with torch.no_grad():
        for p in lstm.parameters():
            p.mul_(8.0)
    x = torch.randn(2, 6, 4)
    lengths = torch.tensor([6, 4])
    state = (torch.zeros(2, 3), torch.zeros(2, 10))
    with torch.no_grad():
        free, (_, free_c) = run_lstm(lstm, x, lengths, state, cell_clip=None, proj_clip=None)
        clipped, (_, clipped_c) = run_lstm(lstm, x, lengths, state, cell_clip=0.7, proj_clip=0.3)
        loop, _ = run_lstm(lstm, x, lengths, state, cell_clip=1e9, proj_clip=1e9)
    assert free_c.abs().max() > 0.7 and free.abs().max() > 0.3  # the clips bind
    assert clipped_c.abs().max() == pytest.approx(0.7) and clipped.abs().max() == pytest.approx(0.3)
    assert (clipped[1, 4:] == 0).all()  # past the end: zeros
    # with clips that never bind, the explicit loop equals torch's kernel
    torch.testing.assert_close(loop, free, atol=1e-6, rtol=1e-5)


# ---- statelessness -----------------------------------------------------------------------------

def test_outputs_do_not_depend_on_batch_or_order():
    model = small_model().double()
    alone = [model.embed_sentences([s])[0] for s in SENTENCES]
    together = model.embed_sentences(SENTENCES)
    shuffled = model.embed_sentences(SENTENCES[::-1], batch_size=2)[::-1]
    again = model.embed_sentences(SENTENCES)
    for a, b, c, d in zip(alone, together, shuffled, again):
        assert a.shape == (3, len(b[0]), 12)
        np.testing.assert_allclose(a, b, atol=1e-12)
        np.testing.assert_allclose(a, c, atol=1e-12)
        np.testing.assert_allclose(a, d, atol=1e-12)
    float32 = small_model()
    for a, b in zip(float32.embed_sentences(SENTENCES), float32.embed_sentences(SENTENCES[::-1])[::-1]):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_stateful_mode_carries_state_per_batch_row():
    stateless = small_model().double()
    stateful = small_model(stateful=True).double()
    first = stateful.embed_sentences(SENTENCES[:2])
    np.testing.assert_allclose(first[0], stateless.embed_sentences(SENTENCES[:1])[0], atol=1e-12)
    second = stateful.embed_sentences(SENTENCES[:2])
    assert not np.allclose(second[0][1:], first[0][1:])  # the LSTM layers saw the carried state
    np.testing.assert_allclose(second[0][0], first[0][0])  # the token layer has no state
    stateful.reset_states()
    np.testing.assert_allclose(stateful.embed_sentences(SENTENCES[:1])[0], first[0], atol=1e-12)
    # a smaller batch leaves the other rows' states alone (bilm-tf keeps max_batch_size rows)
    stateful.reset_states()
    stateful.embed_sentences(SENTENCES[:2])
    stateful.embed_sentences(SENTENCES[2:3])
    via_short = stateful.embed_sentences(SENTENCES[2:4])[1]
    stateful.reset_states()
    stateful.embed_sentences(SENTENCES[:2])
    direct = stateful.embed_sentences(SENTENCES[2:4])[1]
    np.testing.assert_allclose(via_short, direct, atol=1e-12)


# ---- published layout: an independent numpy forward pass ----------------------------------------

def random_published_file(path, config: ElmoConfig, *, seed: int = 3) -> dict[str, np.ndarray]:
    """Random tensors in bilm-tf's layout, scaled so that both clips bind."""
    rng = np.random.default_rng(seed)
    d, n, P, D = config.char_embedding_dim, config.n_filters, config.projection_dim, config.lstm_dim
    tensors = {"char_embed": rng.normal(size=(261, d))}
    for i, (width, count) in enumerate(config.filters):
        tensors[f"CNN/W_cnn_{i}"] = rng.normal(scale=0.3, size=(1, width, d, count))
        tensors[f"CNN/b_cnn_{i}"] = rng.normal(scale=0.1, size=count)
    for k in range(config.n_highway):
        for kind in ("carry", "transform"):
            tensors[f"CNN_high_{k}/W_{kind}"] = rng.normal(scale=0.3, size=(n, n))
            tensors[f"CNN_high_{k}/b_{kind}"] = rng.normal(scale=0.1, size=n)
    tensors["CNN_proj/W_proj"] = rng.normal(scale=0.3, size=(n, P))
    tensors["CNN_proj/b_proj"] = rng.normal(scale=0.1, size=P)
    for direction in range(2):
        for layer in range(config.n_layers):
            root = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            tensors[f"{root}/W_0"] = rng.normal(scale=0.6, size=(P + P, 4 * D))
            tensors[f"{root}/B"] = rng.normal(scale=0.3, size=4 * D)
            tensors[f"{root}/W_P_0"] = rng.normal(scale=0.6, size=(D, P))
    with h5py.File(path, "w") as handle:
        for name, value in tensors.items():
            handle.create_dataset(name, data=value.astype(np.float32))
    return {name: value.astype(np.float32).astype(np.float64) for name, value in tensors.items()}


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_elmo(tensors, config: ElmoConfig, sentence, clip_counts):
    """The whole forward pass from the file's tensors, written from bilm-tf's graph."""
    ids = batch_to_ids([sentence]).numpy()[0]  # (T, 50)
    embedding = np.vstack([np.zeros((1, config.char_embedding_dim)), tensors["char_embed"]])
    chars = embedding[ids]  # (T, 50, d)
    pooled = []
    for i, (width, count) in enumerate(config.filters):
        kernel, bias = tensors[f"CNN/W_cnn_{i}"][0], tensors[f"CNN/b_cnn_{i}"]  # (width, d, count)
        conv = np.stack([
            np.einsum("tkc,kcf->tf", chars[:, p : p + width], kernel) for p in range(chars.shape[1] - width + 1)
        ], axis=1) + bias
        activation = np.tanh if config.activation == "tanh" else (lambda v: np.maximum(v, 0.0))
        pooled.append(activation(conv.max(axis=1)))
    h = np.concatenate(pooled, axis=1)
    for k in range(config.n_highway):
        carry = sigmoid(h @ tensors[f"CNN_high_{k}/W_carry"] + tensors[f"CNN_high_{k}/b_carry"])
        transform = np.maximum(h @ tensors[f"CNN_high_{k}/W_transform"] + tensors[f"CNN_high_{k}/b_transform"], 0.0)
        h = carry * transform + (1.0 - carry) * h
    token = h @ tensors["CNN_proj/W_proj"] + tensors["CNN_proj/b_proj"]
    D, P = config.lstm_dim, config.projection_dim
    outputs = {}
    for direction in range(2):
        x = token if direction == 0 else token[::-1]
        layers = []
        for layer in range(config.n_layers):
            root = f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            kernel, bias, projection = tensors[f"{root}/W_0"], tensors[f"{root}/B"], tensors[f"{root}/W_P_0"]
            m, c = np.zeros(P), np.zeros(D)
            out = []
            for t in range(len(x)):
                z = np.concatenate([x[t], m]) @ kernel + bias
                i, j, f, o = np.split(z, 4)  # TensorFlow's gate order
                c = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(j)
                clip_counts["cell"] += int((np.abs(c) > config.cell_clip).sum())
                c = np.clip(c, -config.cell_clip, config.cell_clip)
                m = (sigmoid(o) * np.tanh(c)) @ projection
                clip_counts["proj"] += int((np.abs(m) > config.proj_clip).sum())
                m = np.clip(m, -config.proj_clip, config.proj_clip)
                out.append(m)
            result = np.array(out) + (x if layer > 0 else 0.0)  # residual from the second layer on
            layers.append(result)
            x = result
        outputs[direction] = [layer if direction == 0 else layer[::-1] for layer in layers]
    stacked = [np.concatenate([token, token], axis=1)] + [
        np.concatenate([f, b], axis=1) for f, b in zip(outputs[0], outputs[1])
    ]
    return np.stack(stacked)[:, 1:-1]


@pytest.fixture
def published(tmp_path):
    options = SMALL.to_options()
    options_file, weight_file = tmp_path / "options.json", tmp_path / "weights.hdf5"
    options_file.write_text(json.dumps(options))
    tensors = random_published_file(weight_file, SMALL)
    return options_file, weight_file, tensors


@pytest.mark.parametrize("activation", ["relu", "tanh"])
def test_loaded_weights_match_numpy_forward_pass(tmp_path, activation):
    config = dataclasses.replace(SMALL, activation=activation)
    options_file, weight_file = tmp_path / "options.json", tmp_path / "weights.hdf5"
    options_file.write_text(json.dumps(config.to_options()))
    tensors = random_published_file(weight_file, config)
    counts = {"cell": 0, "proj": 0}
    sentence = ["Café", "rates", "fell", "."]
    expected = numpy_elmo(tensors, config, sentence, counts)
    assert counts["cell"] > 0 and counts["proj"] > 0  # both clips change the numbers
    model = load_elmo(options_file, weight_file)
    got32 = model.embed_sentences([sentence])[0]
    assert got32.dtype == np.float32 and got32.shape == (3, 4, 12)
    np.testing.assert_allclose(got32, expected, atol=1e-5)
    got64 = model.double().embed_sentences([sentence])[0]
    np.testing.assert_allclose(got64, expected, atol=1e-6)  # file values are float32; the pass is float64
    assert np.abs(got64 - expected).max() < 1e-9


def test_save_load_round_trip_with_softmax(tmp_path):
    vocab = ["<S>", "</S>", "<UNK>", "the", "bank", "."]
    model = small_model(dataclasses.replace(SMALL, n_tokens_vocab=len(vocab)), vocab=vocab)
    save_elmo(model, tmp_path / "o.json", tmp_path / "w.hdf5")
    loaded = load_elmo(tmp_path / "o.json", tmp_path / "w.hdf5")
    assert loaded.vocab == vocab and loaded.config == model.config
    for a, b in zip(model.embed_sentences(SENTENCES), loaded.embed_sentences(SENTENCES)):
        np.testing.assert_array_equal(a, b)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)
    assert perplexity(loaded, SENTENCES).forward == pytest.approx(perplexity(model, SENTENCES).forward)
    with h5py.File(tmp_path / "w.hdf5") as handle:
        assert handle["char_embed"].shape == (261, 5)
        assert handle["CNN/W_cnn_2"].shape == (1, 3, 5, 8)
        assert handle["RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_0"].shape == (12, 48)
        assert handle["softmax/W"].shape == (6, 6)


def test_bad_weight_files_name_the_tensor(published, tmp_path):
    options_file, weight_file, _ = published

    def edited(edit):
        path = tmp_path / f"edited{len(list(tmp_path.iterdir()))}.hdf5"
        path.write_bytes(weight_file.read_bytes())
        with h5py.File(path, "r+") as handle:
            edit(handle)
        return path

    missing = edited(lambda h: h.__delitem__("RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0"))
    with pytest.raises(ValueError, match=r"RNN_1/RNN/MultiRNNCell/Cell1/LSTMCell/W_P_0 is missing"):
        load_elmo(options_file, missing)

    def reshape(h):
        del h["CNN_high_1/W_carry"]
        h.create_dataset("CNN_high_1/W_carry", data=np.zeros((18, 17), dtype=np.float32))

    with pytest.raises(ValueError, match=r"CNN_high_1/W_carry has shape \(18, 17\), expected \(18, 18\)"):
        load_elmo(options_file, edited(reshape))

    def chars(h):
        del h["char_embed"]
        h.create_dataset("char_embed", data=np.zeros((262, 5), dtype=np.float32))

    with pytest.raises(ValueError, match=r"char_embed has shape \(262, 5\), expected \(261, 5\).*character vocabulary"):
        load_elmo(options_file, edited(chars))
    # options and weights that do not match
    three_layers = tmp_path / "three.json"
    three_layers.write_text(json.dumps(dataclasses.replace(SMALL, n_layers=3).to_options()))
    with pytest.raises(ValueError, match=r"Cell2/LSTMCell/W_0 is missing"):
        load_elmo(three_layers, weight_file)
    one_layer = tmp_path / "one.json"
    one_layer.write_text(json.dumps(dataclasses.replace(SMALL, n_layers=1).to_options()))
    with pytest.raises(ValueError, match=r"tensor RNN_0/RNN/MultiRNNCell/Cell1/LSTMCell/B is not part of the model"):
        load_elmo(one_layer, weight_file)
    bad_chars = tmp_path / "chars.json"
    options = SMALL.to_options()
    options["char_cnn"]["n_characters"] = 300
    bad_chars.write_text(json.dumps(options))
    with pytest.raises(ValueError, match=r"n_characters is 300"):
        load_elmo(bad_chars, weight_file)
    no_lstm = tmp_path / "nolstm.json"
    no_lstm.write_text(json.dumps({"char_cnn": SMALL.to_options()["char_cnn"]}))
    with pytest.raises(ValueError, match=r"no 'lstm' section"):
        load_elmo(no_lstm, weight_file)
    with pytest.raises(FileNotFoundError, match="weights file not found"):
        load_elmo(options_file, tmp_path / "nope.hdf5")
    with pytest.raises(ValueError, match="not an HDF5 file"):
        load_elmo(options_file, options_file)


def test_bad_inputs_are_documented_or_clear():
    model = small_model()
    # no repeated pattern, so that characters past the 48th would change the character CNN's maxima
    word = "".join(np.random.default_rng(0).choice(list("abcdefghijklmnopqrstuvwxyz"), 60))
    empty, long, prefix = model.embed_sentences([[], [word], [word[:48]]])
    assert empty.shape == (3, 0, 12)
    # words keep their first 48 bytes: the same characters at another batch row, equal up to float32
    # rounding (which differs between batch rows with the CPU's kernels)
    np.testing.assert_allclose(long, prefix, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="list of sentences"):
        model.embed_sentences("a sentence as one string")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"shape \(batch, time, 50\)"):
        model(torch.zeros(2, 3, 40, dtype=torch.long))
    with pytest.raises(ValueError, match="holds no token"):
        model(torch.zeros(1, 3, 50, dtype=torch.long))
    with pytest.raises(ValueError, match="no softmax"):
        perplexity(model, SENTENCES)


# ---- training ------------------------------------------------------------------------------------

TINY_TRAINING = TrainConfig(
    filters=((1, 8), (2, 8), (3, 16)), char_embedding_dim=8, n_highway=1, lstm_dim=32, projection_dim=16, n_layers=2,
    vocab_size=40, dropout=0.0, epochs=60, batch_tokens=64, learning_rate=1e-2, seed=3,
)


def test_tiny_bilm_overfits_a_few_sentences(tmp_path):
    corpus = Corpus.from_list(SENTENCES)
    result = train(tmp_path / "m", corpus=(corpus, corpus), config=TINY_TRAINING, device="cpu")
    n_vocab = len(load_elmo(tmp_path / "m" / "options.json", tmp_path / "m" / "weights.hdf5").vocab)
    assert result.complete and n_vocab == 20
    assert result.perplexity.average < 2.0 < n_vocab / 5  # far below the vocabulary size
    assert result.perplexity.oov_rate == 0.0
    report = json.loads((tmp_path / "m" / "training.json").read_text())
    assert report["heldout_perplexity"]["forward"] == pytest.approx(result.perplexity.forward)
    again = train(tmp_path / "m", corpus=(corpus, corpus), config=TINY_TRAINING, device="cpu")  # finished: not repeated
    assert again.perplexity == result.perplexity


def test_sampled_softmax_trains():
    corpus = Corpus.from_list(SENTENCES)
    config = dataclasses.replace(TINY_TRAINING, n_negative_samples=8, epochs=60)
    torch.manual_seed(0)
    untrained = ElmoBiLM(config.model_config(20), vocab=["<S>", "</S>", "<UNK>", *sorted({w for s in SENTENCES for w in s})])
    before = perplexity(untrained, SENTENCES).average
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        after = train(folder, corpus=(corpus, corpus), config=config, device="cpu").perplexity.average
    assert after < before / 3


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path):
    corpus = Corpus.from_list(SENTENCES * 3)
    config = dataclasses.replace(TINY_TRAINING, epochs=3, dropout=0.2)
    whole = train(tmp_path / "whole", corpus=(corpus, corpus), config=config, device="cpu", checkpoint_every=2)

    class CrashAtStep5:
        steps = 0

        def start(self, stage: str, total: int, *, unit: str = "items") -> None:
            pass

        def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
            self.steps += n
            if self.steps == 5:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "killed", corpus=(corpus, corpus), config=config, device="cpu", checkpoint_every=2,
              progress=CrashAtStep5())
    assert torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["step"] == 4
    resumed = train(tmp_path / "killed", corpus=(corpus, corpus), config=config, device="cpu", checkpoint_every=2)
    assert resumed.steps == whole.steps > 5
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["model"]
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert resumed.perplexity == whole.perplexity
    other = dataclasses.replace(config, seed=4)
    with pytest.raises(ValueError, match="another config"):
        train(tmp_path / "killed", corpus=(corpus, corpus), config=other, device="cpu")


def test_cli_trains_and_reports(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(" ".join(s) for s in SENTENCES * 5) + "\n", encoding="utf-8")
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, [
        "elmo", "train", "--corpus", str(text), "--out", str(tmp_path / "m"), "--epochs", "1", "--lstm-dim", "16",
        "--projection-dim", "8", "--vocab-size", "30", "--device", "cpu",
    ])
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())
    assert "held-out perplexity forward" in output and "unknown words scored as <UNK>: 0.0 %" in output
    encoder = load_elmo_encoder(tmp_path / "m", device="cpu")
    assert encoder.n_layers == 3 and encoder.dim == 16
    bad = CliRunner().invoke(app, ["elmo", "train", "--corpus", str(tmp_path / "none.txt"), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "none.txt" in bad.output


# ---- encoder and store ---------------------------------------------------------------------------

def test_extract_writes_embed_sentences_rows(tmp_path):
    model = small_model()
    corpus = Corpus.from_list(SENTENCES)
    store = extract(ElmoEncoder(model, model_id="elmo-small"), corpus, tmp_path / "s")
    expected = model.embed_sentences([[w.text for w in s.words] for s in corpus.sentences])
    assert list(store.tokens["word"]) == [w for s in SENTENCES for w in s]
    for layer in range(3):
        np.testing.assert_allclose(np.asarray(store.layer(layer)[:]), np.concatenate([e[layer] for e in expected]), atol=1e-6)
    assert store.meta["model_fingerprint"] == ElmoEncoder(small_model()).model_fingerprint
    assert store.meta["model_fingerprint"] != ElmoEncoder(small_model(seed=1)).model_fingerprint


def test_an_elmo_store_and_its_results_say_its_layers_are_biLSTM_layers(tmp_path):
    """The store and every result of it carry ELMo's own layer note, not the transformer's."""
    from lmgeom.engine import AnalysisOptions
    from lmgeom.stages import analyze_store
    from lmgeom.stages.contextuality import write_contextuality
    from lmgeom.store.layout import LAYER_NOTE

    store = extract(ElmoEncoder(small_model(), model_id="elmo-small"), Corpus.from_list(SENTENCES * 3), tmp_path / "s")
    assert "biLSTM layer l" in store.meta["layer_note"] and "transformer" not in store.meta["layer_note"]
    written = write_contextuality(analyze_store(store, AnalysisOptions(min_contexts=2)), store, tmp_path / "s")
    document = json.loads(next(open(path).read() for path in written if path.endswith("contextuality.json")))
    assert document["layer_note"] == store.meta["layer_note"] != LAYER_NOTE


def test_encoder_rows_equal_the_layers_of_the_same_batches():
    # several batches, sentences reordered by length within them: each sentence's rows must be the
    # `layers()` rows of its own batch row, token layer in both halves
    model = small_model()
    corpus = Corpus.from_list(SENTENCES * 2)
    words = [[w.text for w in s.words] for s in corpus.sentences]
    encoded = ElmoEncoder(model, batch_size=3).encode(corpus.sentences)
    expected = model.embed_sentences(words, batch_size=3)
    for sentence, rows in zip(encoded, expected):
        assert np.array_equal(sentence.vectors, rows)
    token = sentence.vectors[0]
    assert np.array_equal(token[:, : token.shape[1] // 2], token[:, token.shape[1] // 2 :])


def test_load_elmo_encoder_from_folder_or_files(published, tmp_path):
    options_file, weight_file, _ = published
    from_folder = load_elmo_encoder(options_file.parent, device="cpu")
    from_files = load_elmo_encoder(options_file, weight_file, device="cpu")
    assert from_folder.model_fingerprint == from_files.model_fingerprint
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="must hold options.json and weights.hdf5"):
        load_elmo_encoder(tmp_path / "empty")


def test_an_elmo_folder_is_a_model_for_extract_and_run(tmp_path):
    """`lmgeom extract FOLDER` and `lmgeom run --model FOLDER` take an ELMo options + weights folder."""
    from typer.testing import CliRunner

    from lmgeom.cli.main import app
    from lmgeom.encoders import load_encoder
    from lmgeom.store import RepresentationStore

    model = small_model()
    save_elmo(model, tmp_path / "elmo" / "options.json", tmp_path / "elmo" / "weights.hdf5")
    encoder = load_encoder(str(tmp_path / "elmo"), device="cpu")
    assert isinstance(encoder, ElmoEncoder) and encoder.model_fingerprint == ElmoEncoder(model).model_fingerprint
    with pytest.raises(ValueError, match="do not apply to an ELMo model"):
        load_encoder(str(tmp_path / "elmo"), device="cpu", keep_special=True)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(" ".join(s) for s in SENTENCES * 3) + "\n")
    extracted = CliRunner().invoke(app, ["extract", str(tmp_path / "elmo"), "--corpus", str(corpus), "--out", str(tmp_path / "s")])
    assert extracted.exit_code == 0, extracted.output
    store = RepresentationStore.open(tmp_path / "s")
    expected = model.embed_sentences([list(s) for s in SENTENCES * 3])
    np.testing.assert_allclose(np.asarray(store.layer(2)[:]), np.concatenate([e[2] for e in expected]), atol=1e-6)
    ran = CliRunner().invoke(app, ["run", "--model", str(tmp_path / "elmo"), "--corpus", str(corpus), "--out",
                                   str(tmp_path / "run"), "--min-contexts", "2"])
    assert ran.exit_code == 0, ran.output
    assert (tmp_path / "run" / "contextuality.json").exists() and (tmp_path / "run" / "report.html").exists()


@pytest.mark.slow
def test_the_shipped_elmo_brown_loads_and_embeds():
    """The built-in model: its options and weights load through `load_encoder`, its recorded training
    matches, and its vectors are those of `embed_sentences` of the loaded biLM."""
    from lmgeom.encoders import load_encoder
    from lmgeom.encoders.registry import elmo_brown_path

    encoder = load_encoder("elmo-brown", device="cpu")
    assert isinstance(encoder, ElmoEncoder) and (encoder.n_layers, encoder.dim) == (3, 256)
    training = json.loads((elmo_brown_path() / "training.json").read_text())
    assert training["complete"] and training["n_parameters"] == sum(p.numel() for p in encoder.model.parameters()
                                                                    if p.requires_grad)
    assert 50 < training["heldout_perplexity"]["average"] < 1000
    encoded = encoder.encode(Corpus.from_list([SENTENCES[0], SENTENCES[1]]).sentences)
    expected = load_elmo(elmo_brown_path() / "options.json", elmo_brown_path() / "weights.hdf5").embed_sentences(SENTENCES[:2])
    for got, want in zip(encoded, expected):
        np.testing.assert_allclose(got.vectors, want, atol=1e-6)


# ---- Brown split ---------------------------------------------------------------------------------

def test_brown_split_is_every_tenth_file(shared_data):
    files = brown_heldout_files(shared_data / "brown")
    assert len(files) == 50 and files[:4] == ["ca10", "ca20", "ca30", "ca40"] and files[-1] == "cr09"
    train_part, heldout = brown_split(shared_data / "brown")
    assert len(train_part) + len(heldout) == 57340
    assert 0.08 < len(heldout) / 57340 < 0.12
    def first_sentence(name):
        line = next(line for line in (shared_data / "brown" / name).read_text().splitlines() if line.split())
        return [token.rsplit("/", 1)[0] for token in line.split()]

    assert [w.text for w in heldout.sentences[0].words] == first_sentence("ca10")
    assert [w.text for w in train_part.sentences[0].words] == first_sentence("ca01")
