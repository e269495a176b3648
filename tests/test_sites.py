"""Capture sites: stored sites against hand-written hooks, each family's sum rule, the store's sites
(layout, integrity, resume), and `--sites` on `extract`, `analyze`, `geometry` and `run` (calibrate,
similarity and static-embeddings: tests/test_sites_commands.py)."""

from __future__ import annotations

import json
import shutil
from typing import Any, Sequence

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import Corpus
from lmgeom.encoders.hf import HFEncoder
from lmgeom.encoders.sites import FAMILIES, family_of
from lmgeom.encoders.tiny import tiny_model, tiny_tokenizer
from lmgeom.errors import InputError
from lmgeom.sitespec import NAMED_SITES, parse_sites, site_folder
from lmgeom.stages.extraction import extract
from lmgeom.store import RepresentationStore, verify_store

runner = CliRunner()
SENTENCES = ["The bank of the river was steep.", "She went to the bank to deposit money.",
             "Rates at the bank rose again.", "A river bank erodes slowly over many years."]
DECOMPOSITION = ("resid_pre", "attn_out", "mlp_out", "resid_mid")


def flat(output: str) -> str:
    return " ".join(output.split())


# ---- hand-written hooks: each family's sites as the docs define them, written out per model ----------------

def hand_modules(model: torch.nn.Module, block: int) -> dict[str, tuple[torch.nn.Module, str]]:
    """(module, "input" or "output") of every site of block `block` (0-based), written out by hand."""
    kind = model.config.model_type
    if kind == "gpt2":
        b = model.h[block]
        return {"resid_pre": (b, "input"), "attn_out": (b.attn, "output"), "mlp_out": (b.mlp, "output"),
                "resid_mid": (b.ln_2, "input")}
    if kind == "llama":
        b = model.layers[block]
        return {"resid_pre": (b, "input"), "attn_out": (b.self_attn, "output"), "mlp_out": (b.mlp, "output"),
                "resid_mid": (b.post_attention_layernorm, "input")}
    if kind == "gemma3_text":
        b = model.layers[block]
        return {"resid_pre": (b, "input"), "attn_out": (b.post_attention_layernorm, "output"),
                "mlp_out": (b.post_feedforward_layernorm, "output"), "resid_mid": (b.pre_feedforward_layernorm, "input"),
                "attn_raw": (b.self_attn, "output")}
    b = model.encoder.layer[block]
    return {"resid_pre": (b, "input"), "attn_out": (b.attention.output.dense, "output"), "mlp_out": (b.output.dense, "output"),
            "resid_mid": (b.attention.output.LayerNorm, "output"), "ln1_in": (b.attention.output.LayerNorm, "input"),
            "ln2_in": (b.output.LayerNorm, "input")}


def hand_forward(model: torch.nn.Module, tokenizer: Any, text: str) -> tuple[list[np.ndarray], dict[tuple[str, int], np.ndarray]]:
    """The hidden states and every hand-hooked site (by (site, layer), layer = block + 1) of one text."""
    seen: dict[tuple[str, int], torch.Tensor] = {}
    handles = []
    for block in range(model.config.num_hidden_layers):
        for site, (module, what) in hand_modules(model, block).items():
            key = (site, block + 1)
            if what == "input":
                def pre(_m, args, kwargs, key=key):
                    seen[key] = args[0] if args else kwargs["hidden_states"]
                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
            else:
                def post(_m, _args, output, key=key):
                    seen[key] = output[0] if isinstance(output, tuple) else output
                handles.append(module.register_forward_hook(post))
    try:
        with torch.inference_mode():
            ids = torch.tensor([tokenizer(text)["input_ids"]])
            hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True, use_cache=False).hidden_states
    finally:
        for handle in handles:
            handle.remove()
    return [h[0].numpy() for h in hidden], {key: value[0].numpy() for key, value in seen.items()}


def tiny_gemma3() -> tuple[torch.nn.Module, Any]:
    """A seeded random Gemma 3 text model (3 blocks, width 32) with the tiny Llama tokenizer."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    tokenizer = tiny_tokenizer("tiny-llama")
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
                              sliding_window=8, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.unk_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Gemma3TextModel(config)
        for name, parameter in model.named_parameters():  # random norm weights: a zero-init norm hides a misplaced site
            if "norm" in name:
                torch.nn.init.normal_(parameter, std=0.5)
    return model.eval(), tokenizer


def load(name: str) -> tuple[torch.nn.Module, Any]:
    return tiny_gemma3() if name == "tiny-gemma3" else tiny_model(name)


def every_piece(model: torch.nn.Module, tokenizer: Any, name: str, **options: Any) -> HFEncoder:
    """An encoder storing every input position as a row of its own (pieces, special tokens kept)."""
    return HFEncoder(model, tokenizer, model_id=name, pooling="none", keep_special=True, max_batch_size=1, **options)


def slot_index(encoder: HFEncoder, sites: Sequence[str]) -> dict[tuple[str, int], int]:
    captures = encoder.site_captures(sites)
    slots = [(capture.site, layer) for capture in captures for layer in capture.layers]
    return {slot: index for index, slot in enumerate(slots)}


# ---- the sites on each tiny model, against hand hooks, and each family's sum rule --------------------------

@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-bert", "tiny-gemma3"])
def test_stored_sites_equal_hand_written_hooks(name, tmp_path):
    model, tokenizer = load(name)
    encoder = every_piece(model, tokenizer, name)
    sites = parse_sites(",".join(DECOMPOSITION))
    store = extract(encoder, Corpus.from_list(SENTENCES), tmp_path / "store", sites=sites)
    assert store.sites == list(sites)
    n_blocks = model.config.num_hidden_layers
    worst = 0.0
    for sentence in range(len(SENTENCES)):
        rows = store.sentence_rows(sentence)
        hidden, hand = hand_forward(model, tokenizer, SENTENCES[sentence])
        assert len(rows) == len(hidden[0])  # every position is a row
        for layer in range(n_blocks + 1):
            np.testing.assert_allclose(store.rows(layer, rows), hidden[layer], atol=1e-6, rtol=0)
        for site in DECOMPOSITION:
            for layer in range(1, n_blocks + 1):
                diff = np.abs(store.rows(layer, rows, site=site) - hand[site, layer]).max()
                worst = max(worst, float(diff))
                assert diff <= 1e-6, (site, layer, diff)
    assert worst <= 1e-6
    with pytest.raises(InputError, match="resid_post only"):
        store.layer(0, site="attn_out")


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama", "tiny-gemma3"])
def test_pre_norm_sum_rule_holds_at_every_block(name):
    model, tokenizer = load(name)
    sites = parse_sites(",".join(DECOMPOSITION))
    for before_final_norm in (False, True):
        encoder = every_piece(model, tokenizer, name, before_final_norm=before_final_norm)
        at = slot_index(encoder, sites)
        vectors = np.concatenate([e.vectors for e in encoder.encode(Corpus.from_list(SENTENCES).sentences, sites=sites)], axis=1)
        last = model.config.num_hidden_layers
        for layer in range(1, last + 1):
            post, pre, attn, mlp, mid = (vectors[at[site, layer]] for site in ("resid_post", *DECOMPOSITION))
            assert np.abs(mid - (pre + attn)).max() < 1e-5
            residual = np.abs(post - (pre + attn + mlp)).max()
            if layer < last or before_final_norm:
                assert residual < 1e-5, (layer, residual)
            else:  # the model's last hidden state is after its final norm: not the block's output
                assert residual > 1e-2
    # resid_pre of block l is resid_post of layer l - 1
    np.testing.assert_array_equal(vectors[at["resid_pre", 2]], vectors[at["resid_post", 1]])


def test_gemma3_sum_rule_needs_the_post_norms():
    """Gemma 3's sum is exact with attn_out taken after post_attention_layernorm, as its row says, and
    not with the attention module's own output."""
    model, tokenizer = tiny_gemma3()
    assert family_of(model).name == "gemma3"
    encoder = every_piece(model, tokenizer, "tiny-gemma3")
    sites = parse_sites("resid_pre,attn_out,resid_mid,layers.{i}.self_attn")
    at = slot_index(encoder, sites)
    vectors = encoder.encode(Corpus.from_list(SENTENCES[:1]).sentences, sites=sites)[0].vectors
    for layer in (1, 2, 3):
        pre, mid = vectors[at["resid_pre", layer]], vectors[at["resid_mid", layer]]
        assert np.abs(mid - (pre + vectors[at["attn_out", layer]])).max() < 1e-5
        assert np.abs(mid - (pre + vectors[at["layers.{i}.self_attn", layer]])).max() > 1e-2


def test_bert_sum_rule_holds_at_the_layernorm_inputs_not_after(tmp_path):
    model, tokenizer = tiny_model("tiny-bert")
    ln1, ln2 = "encoder.layer.{i}.attention.output.LayerNorm:input", "encoder.layer.{i}.output.LayerNorm:input"
    sites = parse_sites([*DECOMPOSITION, ln1, ln2])
    store = extract(every_piece(model, tokenizer, "tiny-bert"), Corpus.from_list(SENTENCES), tmp_path / "bert", sites=sites)
    for layer in (1, 2, 3):
        pre, attn, mlp, mid, post = (np.asarray(store.layer(layer, site=site)[:])
                                     for site in ("resid_pre", "attn_out", "mlp_out", "resid_mid", "resid_post"))
        first, second = np.asarray(store.layer(layer, site=ln1)[:]), np.asarray(store.layer(layer, site=ln2)[:])
        assert np.abs(first - (pre + attn)).max() < 1e-5
        assert np.abs(second - (mid + mlp)).max() < 1e-5
        block = model.encoder.layer[layer - 1]
        with torch.inference_mode():  # the norms turn the sums into resid_mid and resid_post
            np.testing.assert_allclose(block.attention.output.LayerNorm(torch.from_numpy(first)).numpy(), mid, atol=1e-5)
            np.testing.assert_allclose(block.output.LayerNorm(torch.from_numpy(second)).numpy(), post, atol=1e-5)
        assert np.abs(mid - (pre + attn)).max() > 1e-3  # not after the norm (random LayerNorms are near the identity)
    assert store.meta["site_family"] == "bert" and "not after the norms" in store.meta["site_rule"]
    assert store.meta["sites"][ln1]["folder"] == site_folder(ln1) == "sites/encoder.layer._i_.attention.output.LayerNorm_input"


def test_family_table_covers_every_named_site():
    for family in FAMILIES:
        assert set(family.sites) == set(NAMED_SITES) - {"resid_post"}, family.name


# ---- the store ------------------------------------------------------------------------------------------------

def test_store_of_resid_post_only_is_written_as_before(tmp_path):
    model, tokenizer = tiny_model("tiny-gpt2")
    store = extract(HFEncoder(model, tokenizer, model_id="tiny-gpt2"), Corpus.from_list(SENTENCES), tmp_path / "s")
    assert store.sites == ["resid_post"] and store.layers == [0, 1, 2, 3]
    meta = json.loads((tmp_path / "s" / "meta.json").read_text())
    assert not {"sites", "site_family", "site_rule", "site_last_layer"} & (set(meta) | set(meta["settings"]))
    assert not (tmp_path / "s" / "sites").exists()
    assert np.array_equal(store.layer(2)[:], store.layer(2, site="resid_post")[:])


def test_sites_follow_stored_layers_and_verify(tmp_path):
    model, tokenizer = tiny_model("tiny-llama")
    encoder = HFEncoder(model, tokenizer, model_id="tiny-llama")
    store = extract(encoder, Corpus.from_list(SENTENCES), tmp_path / "s", store_layers="0,2,3", sites="attn_out,layers.1.mlp")
    assert store.site_layers("attn_out") == [2, 3] and store.site_layers("layers.1.mlp") == [2]
    assert store.at_site("attn_out").layers == [2, 3]
    assert verify_store(tmp_path / "s").ok
    with pytest.raises(InputError, match="sites resid_post, attn_out, layers.1.mlp"):
        store.layer(2, site="mlp_out")
    # a folder meta.json does not record is refused on open and by verify
    shutil.copytree(tmp_path / "s" / "sites" / "attn_out", tmp_path / "s" / "sites" / "mlp_out")
    with pytest.raises(InputError, match="not among the sites"):
        RepresentationStore.open(tmp_path / "s")
    assert any("not among the sites" in problem for problem in verify_store(tmp_path / "s").problems)


def test_a_damaged_site_chunk_is_caught(tmp_path):
    model, tokenizer = tiny_model("tiny-gpt2")
    store = extract(HFEncoder(model, tokenizer, model_id="tiny-gpt2"), Corpus.from_list(SENTENCES), tmp_path / "s",
                    sites="mlp_out")
    chunk = next(path for path in (tmp_path / "s" / "sites" / "mlp_out" / "2").rglob("*") if path.is_file() and path.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    data[0] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"layer 2 \(mlp_out\)"):
        np.asarray(RepresentationStore.open(tmp_path / "s").layer(2, site="mlp_out")[:])
    assert not verify_store(tmp_path / "s").ok
    del store


class Crashing:
    """The encoder, stopping at sentence `crash_at` as a killed process would."""

    def __init__(self, inner: HFEncoder, crash_at: int | None) -> None:
        self.inner, self.crash_at = inner, crash_at
        self.model_id, self.n_layers, self.dim = inner.model_id, inner.n_layers, inner.dim

    def settings(self) -> dict[str, Any]:
        return self.inner.settings()

    def site_settings(self, sites: Sequence[str], layers: Sequence[int] | None = None) -> dict[str, Any]:
        return self.inner.site_settings(sites, layers)

    def encode(self, sentences: Any, *, first_index: int = 0, **keywords: Any) -> Any:
        if self.crash_at is not None and first_index <= self.crash_at < first_index + len(sentences):
            raise KeyboardInterrupt("killed")
        return self.inner.encode(sentences, first_index=first_index, **keywords)


def test_an_interrupted_extraction_of_sites_resumes_to_the_same_store(tmp_path):
    model, tokenizer = tiny_model("tiny-gpt2")
    inner = HFEncoder(model, tokenizer, model_id="tiny-gpt2")
    corpus = Corpus.from_list(SENTENCES * 40)
    options = dict(sites="resid_pre,mlp_out", chunk_sentences=16, sort_window=16)
    whole = extract(inner, corpus, tmp_path / "whole", **options)
    with pytest.raises(KeyboardInterrupt):
        extract(Crashing(inner, crash_at=100), corpus, tmp_path / "cut", **options)
    assert 0 < json.loads((tmp_path / "cut" / "progress.json").read_text())["n_sentences"] <= 96  # some chunks committed
    with pytest.raises(InputError, match="sites"):  # other sites are another run
        extract(inner, corpus, tmp_path / "cut", sites="attn_out", chunk_sentences=16, sort_window=16)
    resumed = extract(inner, corpus, tmp_path / "cut", **options)
    for site in whole.sites:
        for layer in whole.site_layers(site):
            assert np.array_equal(whole.layer(layer, site=site)[:], resumed.layer(layer, site=site)[:])
    assert verify_store(tmp_path / "cut").ok


def test_site_names_are_checked():
    assert parse_sites(None) == ("resid_post",)
    assert parse_sites("attn_out, mlp_out,attn_out") == ("resid_post", "attn_out", "mlp_out")
    assert parse_sites("h.{i}.mlp:input") == ("resid_post", "h.{i}.mlp:input")
    for bad in ("attn", "", "h.{j}.mlp", "h..mlp", "h.0.mlp:output", "{i}.mlp"):
        with pytest.raises(InputError, match="resid_post, resid_pre, attn_out, mlp_out, resid_mid") as error:
            parse_sites(bad)
        assert error.value.params == ("sites",)


def test_module_paths_are_checked_on_the_model():
    model, tokenizer = tiny_model("tiny-gpt2")
    encoder = HFEncoder(model, tokenizer, model_id="tiny-gpt2")
    with pytest.raises(InputError, match="`h.0.mlpp`.*holds"):
        encoder.site_captures(parse_sites("h.{i}.mlpp"))
    bert, bert_tokenizer = tiny_model("tiny-bert")
    with pytest.raises(InputError, match="not inside one of the blocks"):
        HFEncoder(bert, bert_tokenizer, model_id="tiny-bert").site_captures(parse_sites("embeddings.LayerNorm"))
    with pytest.raises(InputError, match="layer 0, the embedding output"):
        encoder.site_captures(parse_sites("attn_out"), layers=[0])


# ---- the command line --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "gpt2"
    result = runner.invoke(app, ["extract", "tiny-gpt2", "--corpus", "lee", "--limit", "50", "--out", str(out),
                                 "--sites", "resid_pre,attn_out,mlp_out,resid_post", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    return out, flat(result.output)


def test_extract_command_stores_four_sites(cli_store):
    out, output = cli_store
    store = RepresentationStore.open(out)
    assert store.sites == ["resid_post", "resid_pre", "attn_out", "mlp_out"]
    assert "sites resid_post, resid_pre, attn_out, mlp_out" in output
    assert "layer 3's resid_post is the model's last hidden state, after the final norm `ln_f`" in output
    for layer in (1, 2):
        total = sum(np.asarray(store.layer(layer, site=site)[:], dtype=np.float64) for site in ("resid_pre", "attn_out", "mlp_out"))
        assert np.abs(np.asarray(store.layer(layer)[:]) - total).max() < 1e-5
    assert store.meta["site_last_layer"].startswith("layer 3's resid_post")


def test_analyze_command_reads_a_site(cli_store, tmp_path):
    out, _ = cli_store
    common = ["--sites", "attn_out", "--bootstrap", "0", "--engine", "local", "--device", "cpu", "--min-contexts", "2"]
    result = runner.invoke(app, ["analyze", str(out), "--out", str(tmp_path / "attn"), *common])
    assert result.exit_code == 0, result.output
    document = json.loads((tmp_path / "attn" / "contextuality.json").read_text())
    text = json.dumps(document)
    assert '"site": "attn_out"' in text
    assert sorted({record["layer"] for record in document["records"]}) == [1, 2, 3]
    # without --out: the site's folder of results in the store, not the store's own files (resid_post's)
    default = runner.invoke(app, ["analyze", str(out), *common])
    assert default.exit_code == 0, default.output
    assert not (out / "contextuality.json").exists()
    assert json.loads((out / "site_results" / "attn_out" / "contextuality.json").read_text())["records"] == document["records"]


def test_bad_sites_are_refused_naming_the_option(tmp_path, cli_store):
    result = runner.invoke(app, ["extract", "tiny-gpt2", "--corpus", "lee", "--limit", "5", "--out", str(tmp_path / "x"),
                                 "--sites", "attn"])
    assert result.exit_code == 2
    assert "--sites" in flat(result.output) and "resid_pre, attn_out, mlp_out, resid_mid" in flat(result.output)
    out, _ = cli_store
    missing = runner.invoke(app, ["analyze", str(out), "--sites", "resid_mid", "--out", str(tmp_path / "y")])
    assert missing.exit_code == 2 and "--sites" in flat(missing.output) and "resid_pre" in flat(missing.output)
    several = runner.invoke(app, ["analyze", str(out), "--sites", "attn_out,mlp_out", "--out", str(tmp_path / "z")])
    assert several.exit_code == 2 and "one site at a time" in flat(several.output)


def test_geometry_command_reads_a_site(cli_store, tmp_path):
    out, _ = cli_store
    common = ["--bootstrap", "0", "--rows", "300", "--min-contexts", "2", "--device", "cpu", "--max-sentences", "40"]
    result = runner.invoke(app, ["geometry", str(out), "--sites", "attn_out", "--out", str(tmp_path / "attn"), *common])
    assert result.exit_code == 0, result.output
    document = json.loads((tmp_path / "attn" / "geometry.json").read_text())
    assert document["provenance"]["settings"]["site"] == "attn_out"
    assert sorted(int(layer) for layer in (record["layer"] for record in document["layers"])) == [1, 2, 3]
    post = runner.invoke(app, ["geometry", str(out), "--out", str(tmp_path / "post"), *common])
    assert post.exit_code == 0, post.output
    resid = json.loads((tmp_path / "post" / "geometry.json").read_text())
    assert "site" not in resid["provenance"]["settings"]
    assert sorted(record["layer"] for record in resid["layers"]) == [0, 1, 2, 3]
    by_layer = {record["layer"]: record for record in resid["layers"]}
    assert all(by_layer[r["layer"]]["median_abs"] != r["median_abs"] for r in document["layers"])
    no_out = runner.invoke(app, ["geometry", str(out), "--sites", "attn_out", *common])
    assert no_out.exit_code == 0, no_out.output
    assert not (out / "geometry.json").exists()
    default = json.loads((out / "site_results" / "attn_out" / "geometry.json").read_text())
    assert default["provenance"]["settings"]["site"] == "attn_out" and default["layers"] == document["layers"]
    missing = runner.invoke(app, ["geometry", str(out), "--sites", "resid_mid", "--out", str(tmp_path / "m"), *common])
    assert missing.exit_code == 2 and "--sites" in flat(missing.output)


def test_run_analyses_each_site_in_a_folder_of_its_own(tmp_path):
    from lmgeom.pipeline import run

    options = dict(limit=30, device="cpu", min_contexts=2, layers="0,3", num_workers=1, bootstrap=0, permutations=0,
                   methods=("whitening",))
    out = tmp_path / "run"
    result = run("tiny-gpt2", "lee", out=out, sites="attn_out", **options)
    assert result.store.sites == ["resid_post", "attn_out"]
    assert {"contextuality@attn_out", "isotropy@attn_out"} <= set(result.steps_run)
    site = json.loads((out / "site_results" / "attn_out" / "contextuality.json").read_text())
    assert site["settings"]["site"] == "attn_out" and sorted({r["layer"] for r in site["records"]}) == [1, 2, 3]
    isotropy = json.loads((out / "site_results" / "attn_out" / "isotropy.json").read_text())
    assert isotropy["provenance"]["settings"]["site"] == "attn_out"
    assert sorted({r["layer"] for r in isotropy["records"]}) == [1, 2, 3]
    # the default outputs stay resid_post's, with no site in their settings
    main = json.loads((out / "contextuality.json").read_text())
    assert "site" not in main["settings"] and sorted({r["layer"] for r in main["records"]}) == [0, 1, 2, 3]
    by_layer = {(r["layer"], r["metric"]): r["raw"] for r in main["records"]}
    assert all(by_layer[r["layer"], r["metric"]] != r["raw"] for r in site["records"] if r["metric"] == "self_similarity")
    # the site's numbers are those of `analyze --sites` at the same options
    store = RepresentationStore.open(out)
    from lmgeom.engine import AnalysisOptions
    from lmgeom.stages.analysis import analyze_store

    alone = analyze_store(store, AnalysisOptions(min_contexts=2, bootstrap=0, num_workers=1, device="cpu", site="attn_out"))
    expected = alone.layers.set_index(["layer", "metric"])["raw"]
    for record in site["records"]:
        assert record["raw"] == pytest.approx(expected[record["layer"], record["metric"]], rel=1e-12, nan_ok=True)
    page = (out / "report.html").read_text()
    assert "Capture sites" in page and "attn_out: Self-similarity" in page
    assert (out / "figures" / "site_attn_out_self_similarity.png").exists()
    again = run("tiny-gpt2", "lee", out=out, sites="attn_out", **options)
    assert {"contextuality@attn_out", "isotropy@attn_out"} <= set(again.steps_skipped)


def test_run_refuses_a_bad_site_before_extracting(tmp_path):
    result = runner.invoke(app, ["run", "--model", "tiny-gpt2", "--limit", "5", "--out", str(tmp_path / "r"),
                                 "--sites", "attn"])
    assert result.exit_code == 2 and "--sites" in flat(result.output)
    assert not (tmp_path / "r").exists()


# ---- real models ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_named_model_sites_equal_hand_written_hooks(name):
    from lmgeom.encoders.registry import load_encoder

    encoder = load_encoder(name, device="cpu", pooling="none", keep_special=True, max_batch_size=1)
    sites = parse_sites(",".join(DECOMPOSITION))
    at = slot_index(encoder, sites)
    corpus = Corpus.from_list(SENTENCES[:2])
    for sentence, encoded in zip(SENTENCES[:2], encoder.encode(corpus.sentences, sites=sites)):
        hidden, hand = hand_forward(encoder.model, encoder.tokenizer, sentence)
        for site in DECOMPOSITION:
            for layer in range(1, encoder.n_layers):
                np.testing.assert_allclose(encoded.vectors[at[site, layer]], hand[site, layer], atol=1e-5, rtol=0)
        if family_of(encoder.model).name != "bert":
            for layer in range(1, encoder.n_layers - 1):
                total = sum(encoded.vectors[at[site, layer]].astype(np.float64) for site in ("resid_pre", "attn_out", "mlp_out"))
                assert np.abs(encoded.vectors[at["resid_post", layer]] - total).max() < 1e-3 * max(1.0, np.abs(total).max())


def test_docs_family_table_is_the_code_table():
    """docs/models.md's family table shows `FAMILIES` as it is."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "models.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].split()[0]: [cell.strip().strip("`") for cell in line.split("|")[2:7]]
            for line in text.splitlines() if line.startswith("| ") and " (`" in line.split("|")[1]}
    for family in FAMILIES:
        blocks, *cells = rows[family.name]
        assert blocks == family.blocks
        assert cells == [family.sites[site] for site in ("resid_pre", "attn_out", "mlp_out", "resid_mid")], family.name
