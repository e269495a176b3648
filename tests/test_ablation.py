"""`lmgeom ablate`: the edits on closed forms, the hooks against the model's own hidden states, the loss
against transformers' LM head, the attention share against the attention weights, and a whole run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr

from lmgeom import rundir
from lmgeom.encoders.ablation import Edit, SiteHook
from lmgeom.encoders.registry import load_encoder
from lmgeom.errors import InputError
from lmgeom.stages.ablation import (
    AblationOptions,
    Measured,
    _corpus_pass,
    edit_of,
    effects,
    parse_dims,
    plan_ablations,
    run_ablation,
    site_stats,
)
from lmgeom.stages.lens import readout_of

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_edit_of_dimensions_sets_them_everywhere_and_counts_real_positions() -> None:
    h = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    edited, n = Edit(np.array([1, 4]), np.array([0.0, 2.5])).apply(h, mask)
    assert torch.all(edited[..., 1] == 0) and torch.all(edited[..., 4] == 2.5)
    keep = [0, 2, 3, 5]
    assert torch.equal(edited[..., keep], h[..., keep]) and n == 8 * 2
    assert not torch.equal(h[..., 1], edited[..., 1])  # the input is not changed in place


def test_edit_of_entries_changes_only_those_above_the_cutoff_and_its_control_as_many() -> None:
    h = torch.zeros(1, 4, 5)
    h[0, 0, 2], h[0, 3, 2], h[0, 1, 4] = 500.0, -300.0, 50.0
    h[0, :, 1] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    edited, n = Edit(np.array([2]), np.array([7.0]), select=np.array([2]), cutoff=100.0).apply(h)
    assert n == 2 and edited[0, 0, 2] == 7.0 and edited[0, 3, 2] == 7.0 and edited[0, 1, 4] == 50.0
    # the control: the same tokens (positions 0 and 3), another dimension
    control, m = Edit(np.array([1]), np.array([0.0]), select=np.array([2]), cutoff=100.0).apply(h)
    assert m == n
    assert control[0, :, 1].tolist() == [0.0, 2.0, 3.0, 0.0] and control[0, 0, 2] == 500.0
    with pytest.raises(InputError, match="both"):
        Edit(np.array([1]), np.array([0.0]), select=np.array([2]))


def test_hooks_see_the_hidden_states_and_an_edit_reaches_them() -> None:
    encoder = load_encoder("tiny-gpt2", device="cpu")
    model = encoder.model
    ids = torch.tensor([encoder.tokenizer("The bank of the river was steep and green.")["input_ids"]])
    with torch.inference_mode():
        reference = model(input_ids=ids, output_hidden_states=True).hidden_states
    last = len(reference) - 1
    for layer in range(last):  # the last hidden state is after the final norm; the hook's is the block's output
        with SiteHook(model, "resid_post", layer) as hook, torch.inference_mode():
            model(input_ids=ids)
        assert torch.allclose(hook.seen, reference[layer], atol=1e-6)
    with SiteHook(model, "resid_post", 1, Edit(np.array([0, 3]), np.zeros(2))) as hook, torch.inference_mode():
        edited = model(input_ids=ids, output_hidden_states=True).hidden_states
    assert torch.all(edited[1][..., [0, 3]] == 0)
    assert torch.equal(edited[0], reference[0]) and not torch.allclose(edited[2], reference[2])
    assert hook.n_edited == ids.shape[1] * 2
    with SiteHook(model, "mlp_out", 2) as hook, torch.inference_mode():
        model(input_ids=ids)
    assert hook.module == "h.1.mlp" and hook.seen.shape == reference[2].shape
    with pytest.raises(InputError, match="layer 0"):
        SiteHook(model, "mlp_out", 0)


def test_loss_and_attention_share_equal_transformers() -> None:
    from transformers import GPT2LMHeadModel

    encoder = load_encoder("tiny-gpt2", device="cpu")
    encoder.model.set_attn_implementation("eager")
    lm = GPT2LMHeadModel(encoder.model.config).eval()
    lm.transformer.load_state_dict(encoder.model.state_dict())
    lm.tie_weights()
    texts = ["The bank of the river.", "A short one", "Words in a row, then a few more of them."]
    ids = [list(x) for x in encoder.tokenizer(texts)["input_ids"]]
    measured, _ = _corpus_pass(encoder, ids, readout_of(encoder), [], want_loss=True, want_attention=True, batch=2,
                               collect=False)
    assert measured.loss is not None and measured.attention is not None
    for row, x in enumerate(ids):
        with torch.inference_mode():
            out = lm(input_ids=torch.tensor([x]), labels=torch.tensor([x]), output_attentions=True)
        assert measured.loss[0][row] / measured.loss[1][row] == pytest.approx(float(out.loss), rel=1e-5)
        shares = [float(a[0, :, 1:, 0].mean()) for a in out.attentions]
        assert measured.attention[row] == pytest.approx(shares, rel=1e-5)


def _stats(rows: np.ndarray, special: np.ndarray | None = None, **options: object) -> object:
    return site_stats("resid_post", 3, rows, np.zeros(len(rows), bool) if special is None else special,
                      AblationOptions(**options), None)  # type: ignore[arg-type]


def test_site_stats_find_planted_massive_entries_and_the_mean_values() -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(400, 16)).astype(np.float32)
    rows[::40, 5] = 3000.0  # every 40th position: a massive entry in dimension 5
    rows[7, 9] = -2500.0
    stats = _stats(rows)
    assert stats.dims["massive"] == [5, 9]
    assert stats.cutoff == pytest.approx(max(100.0, 1000 * float(np.median(np.abs(rows)))))
    planned, notes = plan_ablations(stats, AblationOptions(dims=("massive",), how=("mean",), random_draws=2))
    target = planned[0]
    assert target.draw is None and target.dims == (5, 9) and target.select == (5, 9) and not notes
    edit = edit_of(target, stats)
    assert edit.values.tolist() == pytest.approx([3000.0, -2500.0])
    control = edit_of(planned[1], stats)
    assert control.select.tolist() == [5, 9] and not set(control.dims) & {5, 9}
    # the control's mean: each random dimension's mean over the tokens of the massive entries it stands for
    hit = np.abs(rows[:, [5, 9]]) > stats.cutoff
    assert control.values == pytest.approx([rows[hit[:, j], d].mean() for j, d in enumerate(control.dims)])


def test_random_controls_are_seeded_disjoint_and_as_many() -> None:
    rows = np.random.default_rng(1).normal(size=(300, 32))
    rows[:, 4] += 20  # a rogue dimension: it carries the average cosine
    stats = _stats(rows)
    assert stats.dims["rogue"][0] == 4 and stats.dims["massive"] == []
    options = AblationOptions(dims=("rogue", "massive"), how=("zero",), random_draws=3)
    first, notes = plan_ablations(stats, options)
    again, _ = plan_ablations(stats, options)
    assert first == again and len(first) == 4 and "no massive dimension" in notes[0]
    controls = [a.dims for a in first if a.draw is not None]
    assert len(set(controls)) == 3 and all(len(c) == 3 and not set(c) & set(stats.dims["rogue"]) for c in controls)
    zero = edit_of(first[0], stats)
    assert zero.values.tolist() == [0.0, 0.0, 0.0] and zero.select is None
    mean = edit_of(plan_ablations(stats, AblationOptions(dims=("rogue",), how=("mean",), random_draws=0))[0][0], stats)
    assert mean.values == pytest.approx(rows[:, list(mean.dims)].mean(axis=0))


def test_effects_are_the_differences_with_paired_intervals() -> None:
    rng = np.random.default_rng(2)
    n = np.full(50, 10)
    base = Measured(loss=(rng.uniform(20, 40, 50), n))
    target = Measured(loss=(base.loss[0] + 5.0, n))  # +0.5 nats per token in every sentence
    control = Measured(loss=(base.loss[0] + 1.0, n))
    out = effects("loss", None, base, target, [control, control], gold=None, n_boot=200, seed=0)
    assert out["delta"] == pytest.approx(0.5) and out["random_delta_mean"] == pytest.approx(0.1)
    assert out["excess"] == pytest.approx(0.4)
    assert out["delta_low"] == pytest.approx(0.5) and out["delta_high"] == pytest.approx(0.5)  # the same in every resample
    gold = rng.normal(size=40)
    sts_base = Measured(sts={1: gold + rng.normal(scale=0.5, size=40)})
    sts_target = Measured(sts={1: rng.normal(size=40)})
    out = effects("sts", 1, sts_base, sts_target, [], gold=gold, n_boot=100, seed=0)
    expected = 100 * (spearmanr(gold, sts_target.sts[1]).statistic - spearmanr(gold, sts_base.sts[1]).statistic)
    assert out["delta"] == pytest.approx(expected) and out["delta_low"] < out["delta"] < out["delta_high"]
    assert out["excess"] is None


def test_affected_attention_layers() -> None:
    from lmgeom.stages.ablation import affected_attention_layers

    assert affected_attention_layers("resid_post", 2, 5) == [3, 4]
    assert affected_attention_layers("resid_pre", 2, 5) == [2, 3, 4]
    assert affected_attention_layers("mlp_out", 4, 5) == []
    assert affected_attention_layers("resid_post", 0, 5) == [1, 2, 3, 4]


def test_dims_are_checked() -> None:
    assert parse_dims("massive") == "massive" and parse_dims("7, 3,7") == [3, 7]
    with pytest.raises(InputError, match="dims"):
        AblationOptions(dims=("rouge",))
    with pytest.raises(InputError, match="how"):
        AblationOptions(how=("median",))


def test_run_ablation_on_tiny_gpt2(tmp_path: Path) -> None:
    options = AblationOptions(layers="1,2", dims=("0,5",), how=("zero", "mean"), limit=12, random_draws=1, n_boot=20,
                              device="cpu")
    result = run_ablation("tiny-gpt2", "lee", tmp_path / "run", options)
    document = rundir.read_result(tmp_path / "run", rundir.ABLATION)
    assert document is not None and document["settings"]["measures"] == ["loss", "attention"]
    assert len(document["configs"]) == 4 and document["counts"]["n_model_states"] == 1 + 4 * 2
    positions = document["counts"]["n_positions"]
    for config in document["configs"]:
        assert config["dims"] == [0, 5] and config["n_edited"] == positions * 2
        loss = config["effects"]["loss"]
        assert loss["base"] == pytest.approx(document["baseline"]["loss"])
        assert loss["delta"] == pytest.approx(loss["ablated"] - loss["base"])
        assert config["effects"]["attention_first_mean"]["layers"] == list(range(config["layer"] + 1, document["counts"]["n_layers"]))
        # the first layer after the edit is the first whose attention can change
        assert set(config["effects"]["attention_first"]) == {str(layer) for layer in range(config["layer"] + 1, 4)}
    # the unablated loss is transformers' own, token-weighted over the sentences
    from transformers import GPT2LMHeadModel

    from lmgeom.corpus import load_corpus

    encoder = load_encoder("tiny-gpt2", device="cpu")
    lm = GPT2LMHeadModel(encoder.model.config).eval()
    lm.transformer.load_state_dict(encoder.model.state_dict())
    lm.tie_weights()
    total = count = 0.0
    for sentence in load_corpus("lee", limit=12).sentences:
        x = encoder.tokenizer(sentence.text, truncation=True, max_length=encoder.max_length)["input_ids"]
        with torch.inference_mode():
            total += float(lm(input_ids=torch.tensor([x]), labels=torch.tensor([x])).loss) * (len(x) - 1)
        count += len(x) - 1
    assert document["baseline"]["loss"] == pytest.approx(total / count, rel=1e-5)
    assert document["trivial"]["loss_unigram"] > 0
    assert result.paths[1].name == "ablation.csv" if hasattr(result.paths[1], "name") else True
    text = (tmp_path / "run" / "ablation.json").read_text()
    assert not any(isinstance(v, str) and v.startswith("/") for v in document["settings"].values())  # no machine's path
    assert "provenance" in text


def _write_small_data(folder: Path) -> None:
    sts = folder / "stsbenchmark"
    sts.mkdir(parents=True)
    lines = []
    pairs = [("A man is playing a guitar.", "A man plays the guitar.", 4.8), ("A dog runs in the park.", "The cat sleeps.", 0.4),
             ("Two kids are eating.", "Children eat lunch.", 3.9), ("The sky is blue.", "Stocks fell sharply today.", 0.0),
             ("A woman is cutting onions.", "A woman slices an onion.", 4.6), ("He reads a book.", "A man is driving.", 1.0)]
    for i, (a, b, score) in enumerate(pairs):
        lines.append(f"main-captions\tMSRvid\t2012test\t{i}\t{score}\t{a}\t{b}")
    (sts / "sts-test.csv").write_text("\n".join(lines) + "\n")
    ud = folder / "UD_English-EWT"
    ud.mkdir()
    sentences = [[("The", "DET"), ("dog", "NOUN"), ("runs", "VERB"), (".", "PUNCT")],
                 [("A", "DET"), ("cat", "NOUN"), ("sleeps", "VERB"), ("quietly", "ADV"), (".", "PUNCT")],
                 [("Birds", "NOUN"), ("sing", "VERB"), (".", "PUNCT")],
                 [("The", "DET"), ("old", "ADJ"), ("man", "NOUN"), ("walks", "VERB"), (".", "PUNCT")]]

    def conllu(rows: list[list[tuple[str, str]]]) -> str:
        return "\n".join("\n".join(f"{i}\t{w}\t{w.lower()}\t{t}\t_\t_\t0\t_\t_\t_" for i, (w, t) in enumerate(s, 1)) + "\n"
                         for s in rows)

    (ud / "en_ewt-ud-dev.conllu").write_text(conllu(sentences * 3))
    (ud / "en_ewt-ud-test.conllu").write_text(conllu(sentences))


def test_run_ablation_on_an_encoder_measures_sts_and_the_probe(tmp_path: Path) -> None:
    _write_small_data(tmp_path / "data")
    options = AblationOptions(layers="1", dims=("2,7",), how=("zero",), limit=6, random_draws=1, n_boot=10, device="cpu",
                              data_dir=str(tmp_path / "data"), pos_train=12, pos_test=4)
    run_ablation("tiny-bert", "lee", tmp_path / "run", options)
    document = rundir.read_result(tmp_path / "run", rundir.ABLATION)
    assert document is not None and document["settings"]["measures"] == ["sts", "pos", "attention"]
    assert document["counts"]["sts_pairs"] == 6 and document["counts"]["pos_test_words"] == 17
    effects_ = document["configs"][0]["effects"]
    assert set(effects_) >= {"sts_layer", "sts_last", "pos_layer", "pos_last", "attention_first_mean"}
    # the unablated STS score: Spearman of the cosines of mean-pooled sentence vectors, computed apart
    from lmgeom.evaluate.sts import pair_cosines
    from lmgeom.evaluate.sts_data import read_stsb

    data = read_stsb(tmp_path / "data" / "stsbenchmark")
    encoder = load_encoder("tiny-bert", device="cpu")
    vectors = encoder.sentence_embeddings(data.sentences)
    where = {t: i for i, t in enumerate(data.sentences)}
    last = encoder.n_layers - 1
    cos = pair_cosines(vectors[last][[where[t] for t in data.sentences1]], vectors[last][[where[t] for t in data.sentences2]])
    assert effects_["sts_last"]["base"] == pytest.approx(100 * spearmanr(data.scores, cos).statistic, abs=1e-6)
    assert document["trivial"]["pos_most_frequent_tag"] == pytest.approx(1.0)  # every test word was seen with one tag
    assert 0 <= effects_["pos_layer"]["ablated"] <= 1


def test_loss_refused_for_an_encoder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a causal decoder"):
        run_ablation("tiny-bert", "lee", tmp_path / "run", AblationOptions(measures=("loss",), limit=4, device="cpu"))


def test_cli_ablate_prints_the_table_and_refuses_bad_dims_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["ablate", "tiny-gpt2", "--limit", "4", "--layers", "1", "--dims", "0,2", "--how", "zero",
                                 "--random-draws", "1", "--bootstrap", "10", "--device", "cpu", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    document = rundir.read_result(tmp_path / "run", rundir.ABLATION)
    assert document is not None
    loss = document["configs"][0]["effects"]["loss"]
    assert f"{loss['base']:.3f}" in result.output and f"{loss['ablated']:.3f}" in result.output
    assert "layer 0 = embedding output" in " ".join(result.output.split())
    bad = runner.invoke(app, ["ablate", "tiny-gpt2", "--dims", "rouge", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--dims" in bad.output and "Traceback" not in bad.output
    assert not (tmp_path / "bad" / "ablation.json").exists()
