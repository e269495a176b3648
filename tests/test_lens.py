"""The logit lens against a hand-written computation on the tiny decoders, and its refusal of encoders."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lmgeom.corpus import Sentence
from lmgeom.encoders.registry import load_encoder
from lmgeom.errors import InputError
from lmgeom.stages.lens import LensOptions, join_lens, lens_table, readout_of, require_causal, run_lens, spearman_by_sentence

TEXTS = ["The bank of the river was steep.", "She went to the bank to withdraw money.", "A cat sat."]


def _reference(hidden: tuple[torch.Tensor, ...], norm: torch.nn.Module, weight: torch.Tensor, lm_logits: torch.Tensor,
               ids: list[int]) -> dict[str, np.ndarray]:
    """Entropy, KL to the last layer and next-token rank by hand: the final norm on layers 0..L-1 (layer L
    is after it already), the unembedding, log_softmax; the last layer's logits are the LM's own."""
    last = len(hidden) - 1
    logps = []
    for layer, h in enumerate(hidden):
        logits = lm_logits[0] if layer == last else norm(h[0]) @ weight.T
        logps.append(torch.log_softmax(logits.double(), -1))
    n = len(ids) - 1
    targets = torch.tensor(ids[1:])
    entropy = np.stack([-(lp.exp() * lp).sum(-1)[:n].numpy() for lp in logps])
    kl = np.stack([(lp.exp() * (lp - logps[last])).sum(-1)[:n].numpy() for lp in logps])
    rank = np.stack([(lp[:n] > lp[torch.arange(n), targets][:, None]).sum(-1).numpy() for lp in logps])
    return {"entropy": entropy, "kl": kl, "rank": rank, "lm_rank": np.argsort(-lm_logits[0, :n].numpy(), axis=-1)}


def _check(encoder, lm, norm, weight, readout=None) -> None:
    sentences = [Sentence.from_text(t) for t in TEXTS]
    table, counts = lens_table(encoder, sentences, readout=readout, options=LensOptions(batch_sentences=2, max_chunk_mb=1))
    assert counts["n_sentences"] == 3 and counts["n_truncated"] == 0
    layers = encoder.n_layers
    for sid, text in enumerate(TEXTS):
        ids = encoder.tokenizer(text)["input_ids"]
        with torch.inference_mode():
            out = lm(input_ids=torch.tensor([ids]), output_hidden_states=True)
            ref = _reference(out.hidden_states, norm, weight, out.logits, ids)
        got = table[table.sentence_id == sid].sort_values(["layer", "position"])
        assert len(got) == layers * (len(ids) - 1)
        for key in ("entropy", "kl", "rank"):
            values = got[key].to_numpy().reshape(layers, len(ids) - 1)
            residual = np.abs(values - ref[key]).max()
            print(f"{type(lm).__name__} {key}: max |lens - hand| = {residual:.2e}")
            assert residual <= 1e-5, (key, residual)
        last_kl = got[got.layer == layers - 1]["kl"].to_numpy()
        assert np.abs(last_kl).max() <= 1e-9
        last_rank = got[got.layer == layers - 1]["rank"].to_numpy()
        expected = [int(np.flatnonzero(ref["lm_rank"][t] == ids[t + 1])[0]) for t in range(len(ids) - 1)]
        assert last_rank.tolist() == expected
        assert got["entropy"].between(0, np.log(weight.shape[0]) + 1e-9).all()
        assert got[got.layer < layers - 1]["kl"].max() > 1e-4  # the earlier layers do differ from the last (by more than the tolerance)


def test_lens_equals_hand_computation_gpt2() -> None:
    from transformers import GPT2LMHeadModel

    encoder = load_encoder("tiny-gpt2", device="cpu")
    lm = GPT2LMHeadModel(encoder.model.config).eval()
    lm.transformer.load_state_dict(encoder.model.state_dict())
    lm.tie_weights()
    assert torch.equal(lm.lm_head.weight, encoder.model.wte.weight)
    readout = readout_of(encoder)
    assert readout.description["final_norm"] == "ln_f" and readout.description["unembedding"].startswith("tied")
    _check(encoder, lm, encoder.model.ln_f, encoder.model.wte.weight)


def test_lens_equals_hand_computation_llama_with_untied_head() -> None:
    from transformers import LlamaForCausalLM

    encoder = load_encoder("tiny-llama", device="cpu")
    with pytest.raises(InputError, match="tie_word_embeddings"):
        readout_of(encoder)  # a random LlamaModel: untied, and no head was loaded
    lm = LlamaForCausalLM(encoder.model.config).eval()
    lm.model.load_state_dict(encoder.model.state_dict())
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        lm.lm_head.weight.copy_(torch.randn(lm.lm_head.weight.shape, generator=generator))
    readout = readout_of(encoder, weight=lm.lm_head.weight)
    assert readout.description["final_norm"] == "norm"
    _check(encoder, lm, encoder.model.norm, lm.lm_head.weight, readout)


def test_lens_refuses_an_encoder() -> None:
    encoder = load_encoder("tiny-bert", device="cpu")
    with pytest.raises(InputError, match="tiny-bert is not a causal decoder"):
        require_causal(encoder)
    require_causal(load_encoder("tiny-gpt2", device="cpu"))


def test_run_lens_writes_its_files(tmp_path) -> None:
    import pandas as pd

    result = run_lens("tiny-gpt2", "lee", tmp_path / "run", LensOptions(limit=4, device="cpu"))
    document = json.loads((tmp_path / "run" / "lens.json").read_text())
    assert document["kind"] == "lens" and len(document["layers"]) == 4  # 3 blocks and the embedding output
    assert document["counts"]["n_sentences"] == 4
    table = pd.read_parquet(tmp_path / "run" / "lens.parquet")
    assert len(table) == len(result.table) and (table["store_row"] == -1).all()
    assert document["layers"][-1]["kl_mean"] == pytest.approx(0.0, abs=1e-9)
    assert document["provenance"]["companions"]["lens.parquet"]


def test_spearman_by_sentence_known_values() -> None:
    x = np.array([1.0, 2, 3, 4, 5])
    y = np.array([2.0, 1, 4, 3, 5])  # d = (1, 1, 1, 1, 0): rho = 1 - 6 * 4 / (5 * 24) = 0.8
    result = spearman_by_sentence(x, y, np.array([0, 0, 1, 1, 2]), n_boot=200, seed=0)
    assert result["rho"] == pytest.approx(0.8, abs=1e-12) and result["n"] == 5 and result["n_groups"] == 3
    assert result["low"] <= result["rho"] <= result["high"] + 1e-12
    monotone = spearman_by_sentence(np.arange(40.0), np.arange(40.0) ** 3, np.arange(40) // 4, n_boot=100, seed=1)
    assert monotone["rho"] == pytest.approx(1.0) and monotone["low"] == pytest.approx(1.0)
    again = spearman_by_sentence(x, y, np.array([0, 0, 1, 1, 2]), n_boot=200, seed=0)
    assert again == result  # seeded


def test_join_lens_matches_the_files(tmp_path) -> None:
    import pandas as pd
    from scipy import stats

    from lmgeom.stages.analysis import analyze_store
    from lmgeom.engine.options import AnalysisOptions
    from lmgeom.stages.extraction import extract_model

    run = tmp_path / "run"
    store = extract_model("tiny-gpt2", "lee", out=run, limit=30, device="cpu")
    analyze_store(store, AnalysisOptions(min_contexts=2, bootstrap=0), write_to=run)
    with pytest.raises(InputError, match="holds a store of"):
        run_lens("tiny-llama", "lee", run, LensOptions(limit=30, device="cpu"))
    run_lens("tiny-gpt2", "lee", run, LensOptions(limit=30, device="cpu"))
    result = join_lens(run, n_boot=50)
    assert json.loads((run / "lens_join.json").read_text())["kind"] == "lens_join"
    lens = pd.read_parquet(run / "lens.parquet")
    words = pd.read_csv(run / "contextuality_words.csv", keep_default_na=False, na_values=[""], dtype={"word": str})
    tokens = store.tokens
    layer = 2
    rows = lens[(lens.layer == layer) & lens.is_last_piece & (lens.store_row >= 0)].copy()
    rows["word"] = tokens["word"].to_numpy()[rows["store_row"].to_numpy()]
    sims = words[words.layer == layer].dropna(subset=["self_similarity"]).set_index("word")["self_similarity"]
    rows = rows[rows.word.isin(sims.index)]
    expected = stats.spearmanr(rows["entropy"], sims.loc[rows.word].to_numpy()).statistic
    entry = next(e for e in result["by_layer"] if e["layer"] == layer)
    assert entry["entropy"]["n"] == len(rows) > 10
    assert entry["entropy"]["rho"] == pytest.approx(expected, abs=1e-12)
    assert result["across_layers"] is None  # no geometry.json in this run
    # `lmgeom geometry` on the same run joins the lens to the geometry it writes: the across-layer correlation appears
    from lmgeom.stages.geometry import GeometryOptions, measure_geometry

    (run / "lens_join.json").unlink()
    written = measure_geometry(store, GeometryOptions(n_boot=0, analysis=AnalysisOptions(min_contexts=2, bootstrap=0))).paths
    joined = json.loads((run / "lens_join.json").read_text())
    assert any(str(path).endswith("lens_join.json") for path in written)
    assert joined["across_layers"]["layers"] == [0, 1, 2, 3]
    assert next(e for e in joined["by_layer"] if e["layer"] == layer)["entropy"]["rho"] == pytest.approx(expected, abs=1e-12)


def test_cli_refuses_an_encoder_in_one_line(tmp_path) -> None:
    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    result = CliRunner().invoke(app, ["lens", "tiny-bert", "--limit", "2", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "tiny-bert is not a causal decoder" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "lens.json").exists()
