"""Attribution of a layer's mean, variance and largest entries to the terms that sum to it: the
closed form on synthetic sums, the streamed stage against numpy on a tiny store's rows, BERT at its
LayerNorm inputs, and the error for a store without the sites."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.corpus import Corpus
from lmgeom.encoders.hf import HFEncoder
from lmgeom.encoders.tiny import tiny_model
from lmgeom.errors import InputError
from lmgeom.metrics.attribution import TermMomentAccumulator, attribution_summary, decompose, term_pairs
from lmgeom.sitespec import parse_sites
from lmgeom.stages.attribution import BERT_LN1, BERT_LN2, AttributionOptions, attribute_store
from lmgeom.stages.extraction import extract

SENTENCES = ["The bank of the river was steep.", "She went to the bank to deposit money.",
             "Rates at the bank rose again.", "A river bank erodes slowly over many years.",
             "Nobody saw the bank manager leave early.", "The old river ran past the mill."]


def moments(terms: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return (np.stack([t.sum(axis=0) for t in terms]),
            np.stack([np.einsum("nd,nd->d", terms[k], terms[j]) for k, j in term_pairs(len(terms))]))


def test_closed_form_shares_on_synthetic_sums():
    a = np.array([1.0, -1.0, 1.0, -1.0])
    b = np.array([1.0, -1.0, -1.0, 1.0])  # zero mean, orthogonal to a
    # dimension 0: t2 = 3 a (perfectly correlated); dimension 1: t2 = b (uncorrelated)
    t1 = np.stack([a + 2.0, a], axis=1)
    t2 = np.stack([3 * a + 1.0, b], axis=1)
    sums, products = moments([t1, t2])
    dec = decompose(sums, products, 4)
    np.testing.assert_allclose(dec.mean, [3.0, 0.0])
    np.testing.assert_allclose(dec.mean_shares, [2 / 3, 1 / 3])  # <(2,0),(3,0)>/9, <(1,0),(3,0)>/9
    np.testing.assert_allclose(dec.variance, [16.0, 2.0])  # (1 + 3)^2, 1 + 1
    dim0 = dec.variance_parts([0])
    np.testing.assert_allclose(dim0["total"], [4 / 16, 12 / 16])  # (1 + 3) / 16, (9 + 3) / 16
    np.testing.assert_allclose(dim0["own"], [1 / 16, 9 / 16])
    np.testing.assert_allclose(dim0["cross"], [3 / 16, 3 / 16])
    dim1 = dec.variance_parts([1])
    np.testing.assert_allclose(dim1["total"], [0.5, 0.5])
    np.testing.assert_allclose(dim1["cross"], [0.0, 0.0], atol=1e-15)
    trace = dec.variance_parts()
    np.testing.assert_allclose(trace["total"], [5 / 18, 13 / 18])
    np.testing.assert_allclose(dec.dimension_shares(), [[0.25, 0.5], [0.75, 0.5]])
    # a shift changes nothing but where the sums are taken
    shift = np.array([[2.0, 0.5], [-1.0, 3.0]])
    shifted = decompose(*moments([t1 - shift[0], t2 - shift[1]]), 4, shift=shift)
    np.testing.assert_allclose(shifted.term_means, dec.term_means)
    np.testing.assert_allclose(shifted.covariances, dec.covariances, atol=1e-12)


def test_accumulator_random_terms_merge_and_massive_entries():
    rng = np.random.default_rng(0)
    n, d = 500, 20
    terms = [rng.normal(5.0, 1.0, (n, d)), rng.normal(-2.0, 2.0, (n, d)), rng.normal(0.0, 0.5, (n, d))]
    terms[2][:, 4] += 30.0  # an outlier dimension (mean |x|) written by the third term
    terms[2][123, 4] = 400.0  # one massive entry written by the third term
    x = sum(terms)
    whole = TermMomentAccumulator(3, top_k=4).add(np.stack([x, *terms], axis=1), rows=np.arange(n))
    halves = TermMomentAccumulator(3, top_k=4).add_terms(x[:200], [t[:200] for t in terms], rows=np.arange(200))
    halves.merge(TermMomentAccumulator(3, top_k=4).add_terms(x[200:] + 0, [t[200:] for t in terms], rows=np.arange(200, n)))
    for acc in (whole, halves):
        result = acc.result()
        cov = np.stack([[np.mean((tk - tk.mean(0)) * (tj - tj.mean(0)), axis=0) for tj in terms] for tk in terms])
        np.testing.assert_allclose(result.decomposition.covariances, cov, rtol=1e-10)
        np.testing.assert_allclose(result.decomposition.mean, x.mean(axis=0), rtol=1e-12)
        summary = attribution_summary(result, ["a", "b", "c"])
        assert sum(summary["mean_shares"].values()) == pytest.approx(1.0, abs=1e-12)
        assert sum(p["total"] for p in summary["variance_shares"].values()) == pytest.approx(1.0, abs=1e-12)
        top = summary["massive"][0]
        assert (top["row"], top["dimension"]) == (123, 4)
        assert top["shares"]["c"] == pytest.approx(400.0 / x[123, 4], rel=1e-12)
        assert [o["dimension"] for o in summary["outlier_dimensions"]] == [4]  # its mean |x| stands out
        assert summary["outlier_dimensions"][0]["shares"]["c"]["own"] > 0.5
        assert summary["residual"] == 0.0
    assert [e["row"] for e in attribution_summary(halves.result(), "abc")["massive"]] == \
           [e["row"] for e in attribution_summary(whole.result(), "abc")["massive"]]


def direct(store, layer, total, terms):
    """The attribution computed by numpy on every stored row at once."""
    T = [np.asarray(store.layer(layer, site=site)[:], dtype=np.float64) for site in terms]
    stored = np.asarray(store.layer(layer, site=total)[:], dtype=np.float64)
    x = sum(T)
    mu = x.mean(axis=0)
    mean_shares = [float(t.mean(axis=0) @ mu / (mu @ mu)) for t in T]
    xc = x - mu
    variance_shares = [float(np.sum((t - t.mean(0)) * xc) / np.sum(xc * xc)) for t in T]
    per_dim = np.stack([np.sum((t - t.mean(0)) * xc, axis=0) / np.sum(xc * xc, axis=0) for t in T])
    flat = np.argmax(np.abs(x))
    row, dim = divmod(int(flat), x.shape[1])
    return dict(mean_shares=mean_shares, variance_shares=variance_shares, per_dim=per_dim, top=(row, dim, x[row, dim]),
                residual=float(np.abs(stored - x).max()))


def gpt2_store(path, **options):
    model, tokenizer = tiny_model("tiny-gpt2")
    encoder = HFEncoder(model, tokenizer, model_id="tiny-gpt2", **options)
    return extract(encoder, Corpus.from_list(SENTENCES), path, sites=parse_sites("resid_pre,attn_out,mlp_out"))


def test_streamed_equals_numpy_on_a_tiny_gpt2_store(tmp_path):
    store = gpt2_store(tmp_path / "s")
    result = attribute_store(store, AttributionOptions(chunk_rows=7))  # many chunks, shifted by the first one
    terms = ("resid_pre", "attn_out", "mlp_out")
    last = store.n_model_layers - 1
    assert [e["layer"] for e in result.document["layers"]] == list(range(1, last + 1))
    for entry in result.document["layers"]:
        want = direct(store, entry["layer"], "resid_post", terms)
        np.testing.assert_allclose([entry["mean_shares"][t] for t in terms], want["mean_shares"], rtol=1e-10)
        np.testing.assert_allclose([entry["variance_shares"][t]["total"] for t in terms], want["variance_shares"], rtol=1e-10)
        for dim in entry["top_variance_dimensions"] + entry["outlier_dimensions"]:
            np.testing.assert_allclose([dim["shares"][t]["total"] for t in terms], want["per_dim"][:, dim["dimension"]],
                                       rtol=1e-10)
        top = entry["massive"][0]
        assert (top["row"], top["dimension"]) == want["top"][:2]
        assert top["value"] == pytest.approx(want["top"][2], rel=1e-12)
        assert sum(top["shares"].values()) == pytest.approx(1.0, abs=1e-9)
        assert entry["residual"] == pytest.approx(want["residual"], rel=1e-12, abs=1e-12)
        # exact at the blocks, not at the last layer, which is after the final norm
        assert (entry["residual"] < 1e-5) == (entry["layer"] < last), (entry["layer"], entry["residual"])
    document = json.loads((tmp_path / "s" / "attribution.json").read_text())
    assert document["kind"] == "attribution" and document["family"] == "gpt2" and "provenance" in document
    assert (tmp_path / "s" / "attribution.csv").read_text().startswith("layer,sum,part,dimension,term,share")


def test_before_final_norm_makes_the_last_layer_exact(tmp_path):
    store = gpt2_store(tmp_path / "s", before_final_norm=True)
    result = attribute_store(store, AttributionOptions(layers="last"), write=False)
    (entry,) = result.document["layers"]
    assert entry["layer"] == store.n_model_layers - 1 and entry["residual"] < 1e-5


def test_bert_is_attributed_at_its_layernorm_inputs(tmp_path):
    model, tokenizer = tiny_model("tiny-bert")
    sites = parse_sites(["resid_pre", "attn_out", "mlp_out", "resid_mid", BERT_LN1, BERT_LN2])
    store = extract(HFEncoder(model, tokenizer, model_id="tiny-bert"), Corpus.from_list(SENTENCES), tmp_path / "b", sites=sites)
    result = attribute_store(store, AttributionOptions(layers="1,2", chunk_rows=5), write=False)
    assert [(e["layer"], e["sum"]) for e in result.document["layers"]] == [(1, "attention"), (1, "mlp"), (2, "attention"), (2, "mlp")]
    for entry in result.document["layers"]:
        terms = tuple(entry["terms"])
        assert terms == (("resid_pre", "attn_out") if entry["sum"] == "attention" else ("resid_mid", "mlp_out"))
        want = direct(store, entry["layer"], entry["sum_site"], terms)
        np.testing.assert_allclose([entry["mean_shares"][t] for t in terms], want["mean_shares"], rtol=1e-10)
        np.testing.assert_allclose([entry["variance_shares"][t]["total"] for t in terms], want["variance_shares"], rtol=1e-10)
        assert entry["residual"] < 1e-5


def test_a_store_without_the_sites_is_refused(tmp_path):
    model, tokenizer = tiny_model("tiny-gpt2")
    store = extract(HFEncoder(model, tokenizer, model_id="tiny-gpt2"), Corpus.from_list(SENTENCES), tmp_path / "s",
                    sites=parse_sites("resid_pre,mlp_out"))
    with pytest.raises(InputError, match="attn_out") as caught:
        attribute_store(store, write=False)
    assert "sites" in caught.value.params
    outcome = CliRunner().invoke(app, ["attribute", str(tmp_path / "s")])
    assert outcome.exit_code == 2 and "--sites" in outcome.output and "attn_out" in outcome.output
