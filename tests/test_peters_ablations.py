"""Peters et al.'s ablation options of the layer experiment (lambda, layer norm, raw layers) and the
trivial baselines of every task table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

from lmgeom.evaluate.baselines import (
    binomial_test,
    label_permutation_test,
    majority_class,
    most_frequent_tagger,
    beats_baseline,
    trivial_baselines,
)
from lmgeom.evaluate.tasks import SentenceSplit, SentenceTask, TaggedSplit, TaggingTask, f1, matthews, read_ud_pos
from lmgeom.stages.experiments import ExperimentOptions, run_layers
from lmgeom.stages.experiments.core import CellStore
from lmgeom.stages.experiments.heads import ProbeOptions, _Probe, fit_probe
from lmgeom.stages.experiments.layers import mix_label

from helpers import FAST_PROBE, synthetic_layers

# ---- lambda, layer norm, raw layers --------------------------------------------------------------


def test_the_lambda_term_is_bilm_tf_l2_coef_times_the_sum_of_squared_weights() -> None:
    probe = _Probe(3, False, 4, 2, mix_l2=0.5)
    assert probe.mix is not None
    with torch.no_grad():
        probe.mix.weights.copy_(torch.tensor([1.0, -2.0, 0.5]))
    assert probe.regulariser().item() == pytest.approx(0.5 * (1.0 + 4.0 + 0.25))
    assert _Probe(3, False, 4, 2).regulariser().item() == 0.0  # no lambda: no term
    groups = probe.parameter_groups(1e-4)  # with a lambda the mix is out of the weight decay, as in bilm-tf
    assert [g["weight_decay"] for g in groups] == [1e-4, 0.0]
    assert {id(p) for p in groups[1]["params"]} == {id(probe.mix.weights), id(probe.mix.gamma)}
    with pytest.raises(ValueError, match="`mix_l2` must be a number >= 0"):
        ProbeOptions(mix_l2=-1.0)


def test_a_large_lambda_holds_the_mix_at_uniform_and_a_small_one_lets_it_pick_the_layer() -> None:
    X, y = synthetic_layers(0)
    free = fit_probe(X[:2500], y[:2500], {}, regression=False, n_classes=3, seed=0, metric=matthews,
                     options=ProbeOptions(**{**FAST_PROBE.__dict__, "mix_l2": 0.001}))
    held = fit_probe(X[:2500], y[:2500], {}, regression=False, n_classes=3, seed=0, metric=matthews,
                     options=ProbeOptions(**{**FAST_PROBE.__dict__, "mix_l2": 100.0}))
    assert np.argmax(free.mix_weights) == 1 and free.mix_weights[1] > 0.5
    assert max(abs(w - 1 / 3) for w in held.mix_weights) < 0.02
    assert max(abs(w - 1 / 3) for w in held.mix_weights) < max(abs(w - 1 / 3) for w in free.mix_weights) / 10


def test_layer_norm_and_raw_layers_change_what_the_probe_sees() -> None:
    X, y = synthetic_layers(1)
    X = X.copy()
    X[:, 0] *= 1000.0  # a noise layer on a huge scale: raw, it swamps an unnormalised mix
    options = {**FAST_PROBE.__dict__, "mix_l2": 0.001}
    raw = fit_probe(X[:2500], y[:2500], {"t": X[2500:]}, regression=False, n_classes=3, seed=0, metric=matthews,
                    options=ProbeOptions(**{**options, "standardize": False}))
    raw_ln = fit_probe(X[:2500], y[:2500], {"t": X[2500:]}, regression=False, n_classes=3, seed=0, metric=matthews,
                       options=ProbeOptions(**{**options, "standardize": False, "mix_layer_norm": True}))
    accuracy = {name: float(np.mean(r.predictions["t"] == y[2500:])) for name, r in (("raw", raw), ("ln", raw_ln))}
    assert accuracy["ln"] > 0.9 and accuracy["ln"] > accuracy["raw"] + 0.1
    assert np.argmax(raw_ln.mix_weights) == 1
    assert "raw layers" in ProbeOptions(standardize=False).describe()
    assert "standardised" in ProbeOptions().describe()


def test_mix_variants_are_cells_of_their_own_and_default_keys_do_not_change(shared_data: Path, tmp_path: Path) -> None:
    data = shared_data / "GLUE" / "MRPC"
    result = run_layers("tiny-bert", "mrpc", data, out=tmp_path, options=ExperimentOptions(seeds=1, max_train=40, max_eval=30, device="cpu"),
                        features=["top", "mix"], mix_l2=[None, 1.0], mix_layer_norm=[False, True])
    labels = {r["features"] for r in result.records}
    assert labels == {"top", "mix", "mix ln", "mix l2=1", "mix l2=1 ln"}
    assert mix_label(0.001, True) == "mix l2=0.001 ln"
    store = CellStore(tmp_path)
    base = {"experiment": "layers", "task": "mrpc", "model": "tiny-bert", "regime": "frozen", "method": "none",
            "head": "linear", "pooling": "mean", "max_train": 40, "max_eval": 30}
    # the keys of cells written before the options existed: the default mix and top are found under them
    assert store.load({**base, "features": "mix"}, 0) is not None and store.load({**base, "features": "top"}, 0) is not None
    assert store.load({**base, "features": "mix", "mix_l2": 1.0, "mix_layer_norm": True}, 0) is not None
    tested = {(s["features"], s["split"], s["metric"]): s for s in result.summaries}
    assert tested[("mix l2=1 ln", "dev", "f1")]["baseline"] == "features=top"
    document = json.loads((tmp_path / "results.json").read_text())
    assert "deviation from Peters" in document["settings"]["layers"]
    assert "lambda=1" in document["settings"]["mix"]["mix l2=1 ln"]
    raw = run_layers("tiny-bert", "mrpc", data, out=tmp_path, options=ExperimentOptions(seeds=1, max_train=40, max_eval=30, device="cpu"),
                     features=["top"], standardize=False)
    assert store.load({**base, "features": "top", "standardize": False}, 0) is not None
    assert json.loads((tmp_path / "results.json").read_text())["settings"]["standardize"] is False
    assert {r["standardize"] for r in raw.records} == {False}


def test_the_cli_takes_the_mix_options(shared_data: Path, tmp_path: Path) -> None:
    from lmgeom.cli.main import app

    runner = CliRunner()
    args = ["experiment", "layers", "--model", "tiny-bert", "--task", "mrpc", "--data", str(shared_data / "GLUE" / "MRPC"),
            "--features", "top,mix", "--seeds", "1", "--max-train", "30", "--max-eval", "20", "--device", "cpu"]
    ok = runner.invoke(app, [*args, "--mix-l2", "0.001", "--mix-layer-norm", "on", "--raw", "--out", str(tmp_path / "a")],
                       env={"COLUMNS": "100"})
    assert ok.exit_code == 0, ok.output
    document = json.loads((tmp_path / "a" / "results.json").read_text())
    assert document["settings"]["features"] == ["top", "mix l2=0.001 ln"] and document["settings"]["standardize"] is False
    assert "trivial baseline: dev f1: majority class" in ok.output
    bad = runner.invoke(app, [*args, "--mix-l2", "big", "--out", str(tmp_path / "b")])
    assert bad.exit_code == 2 and "--mix-l2" in bad.output
    bad = runner.invoke(app, [*args, "--mix-layer-norm", "yes", "--out", str(tmp_path / "c")])
    assert bad.exit_code == 2 and "--mix-layer-norm" in bad.output


# ---- trivial baselines ----------------------------------------------------------------------------


def sentence_task(train: list[int], evaluation: list[int], metrics: tuple[str, ...]) -> SentenceTask:
    return SentenceTask("toy", "classification", False,
                        {"train": SentenceSplit([f"s{i}" for i in range(len(train))], np.array(train)),
                         "dev": SentenceSplit([f"d{i}" for i in range(len(evaluation))], np.array(evaluation))},
                        metrics, ["no", "yes"])


def test_majority_and_all_positive_on_hand_made_labels() -> None:
    assert majority_class(np.array([2, 0, 2, 1])) == 2 and majority_class(np.array([1, 0])) == 0  # tie: smallest
    task = sentence_task([0, 0, 0, 1, 1], [1, 1, 0, 1], ("f1", "accuracy", "matthews"))
    majority, positive = trivial_baselines(task, np.arange(5), {"dev": np.arange(4)})
    assert majority.name == "majority class" and positive.name == "all positive"
    # majority = 0: accuracy 1/4, F1 of class 1 = 0, Matthews 0
    assert majority.scores["dev"] == {"f1": 0.0, "accuracy": 0.25, "matthews": 0.0}
    # all positive: accuracy 3/4, F1 = 2*3 / (3 + 4) = 6/7
    assert positive.scores["dev"]["accuracy"] == 0.75 and positive.scores["dev"]["f1"] == pytest.approx(6 / 7)
    # only the chosen training rows count: rows 3, 4 make 1 the majority
    (only,) = trivial_baselines(sentence_task([0, 0, 0, 1, 1], [1, 0], ("accuracy",)), np.array([3, 4]), {"dev": np.arange(2)})
    assert only.predictions["dev"].tolist() == [1, 1]


def test_most_frequent_tag_on_hand_made_sentences() -> None:
    tagger = most_frequent_tagger([["The", "dog", "runs"], ["the", "runs", "."], ["Dog", "runs"]],
                                  [["DET", "NOUN", "VERB"], ["DET", "NOUN", "PUNCT"], ["PROPN", "VERB"]])
    # "runs": VERB 2, NOUN 1; "dog"/"Dog" lowercased: NOUN 1 vs PROPN 1, a tie won by NOUN (more frequent overall)
    assert tagger.best == {"the": "DET", "dog": "NOUN", "runs": "VERB", ".": "PUNCT"}
    assert tagger.unseen == "DET"  # DET, NOUN and VERB 2 each overall: the tie goes to the first alphabetically
    assert tagger.tag([["THE", "cat", "runs"]]) == [["DET", "DET", "VERB"]]
    task = TaggingTask("toy", {"train": TaggedSplit([["a", "b"], ["a", "c"]], [["X", "Y"], ["X", "Z"]]),
                               "test": TaggedSplit([["a", "d", "c"]], [["X", "Y", "Y"]])}, ["X", "Y", "Z"])
    (mft,) = trivial_baselines(task, np.arange(2), {"test": np.arange(1)})
    assert mft.predictions["test"].tolist() == [0, 0, 2]  # a -> X, unseen d -> X (most frequent), c -> Z
    assert mft.scores["test"]["accuracy"] == pytest.approx(1 / 3)


def test_the_most_frequent_tag_rule_on_ud_english_ewt(shared_data: Path) -> None:
    task = read_ud_pos(shared_data / "UD_English-EWT")
    (mft,) = trivial_baselines(task, np.arange(len(task.splits["train"].sentences)),
                               {"test": np.arange(len(task.splits["test"].sentences))})
    assert mft.scores["test"]["accuracy"] == pytest.approx(20557 / 25094)  # 0.8192


def test_the_tests_against_a_trivial_baseline() -> None:
    truth = np.array([1] * 60 + [0] * 40)
    good = truth.copy()
    good[:10] = 0  # 90 of 100 correct
    test = binomial_test(truth, good, 0.6)
    assert test.p_value == pytest.approx(stats.binom.sf(89, 100, 0.6))
    assert beats_baseline("accuracy", truth, good, np.ones(100), 0.6)[0]
    assert not beats_baseline("accuracy", truth, np.ones(100, dtype=int), np.ones(100), 0.6)[0]  # it *is* the baseline
    permuted = label_permutation_test(truth, good, matthews, n_resamples=999)
    assert permuted.p_value == pytest.approx(1 / 1000)  # no shuffle reaches MCC 0.82
    beats, _ = beats_baseline("matthews", truth, np.random.default_rng(0).permutation(truth), np.zeros(100), 0.0)
    assert not beats
    beats, f1_test = beats_baseline("f1", truth, good, np.ones(100, dtype=int), f1(truth, np.ones(100)))
    assert beats and f1_test.p_value < 0.05
