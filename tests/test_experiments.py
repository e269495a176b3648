from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from typer.testing import CliRunner

from lmgeom.calibrate import make_calibrator
from lmgeom.evaluate.stats import holm, paired_permutation_test
from lmgeom.evaluate.tasks import TaggedSplit, load_task, matthews
from lmgeom.metrics.isotropy import isoscore, log_partition_isotropy
from lmgeom.stages.experiments import ExperimentOptions, run_calibration, run_layers
from lmgeom.stages.experiments.core import task_data
from lmgeom.stages.experiments.features import FeatureCache
from lmgeom.stages.experiments.heads import fit_probe
from lmgeom.store.layout import LAYER_NOTE

from helpers import FAST_PROBE, synthetic_layers

MODEL = "tiny-bert"
SMALL = {"max_train": 60, "max_eval": 40}


@pytest.fixture(scope="module")
def cola(shared_data: Path) -> Path:
    return shared_data / "GLUE" / "CoLA"


@pytest.fixture(scope="module")
def calibration(cola: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calibration") / "quick"
    run_calibration(MODEL, "cola", cola, out=out, options=ExperimentOptions(seeds=2, device="cpu", **SMALL),
                    methods=["none", "whitening", "isobn"], heads=["logreg"])
    return out


def tiny_loader(pooling: str):  # type: ignore[no-untyped-def]
    from lmgeom.encoders.registry import load_encoder

    return load_encoder(MODEL, device="cpu", pooling=pooling)


def test_frozen_cells_equal_a_hand_made_pipeline(calibration: Path, cola: Path) -> None:
    document = json.loads((calibration / "results.json").read_text())
    records = document["records"]
    assert len(records) == 2 * 2 * 2  # methods (isobn skipped) x seeds x splits
    assert any("isobn skipped" in note for note in document["notes"])
    assert {r["head_regularisation"] for r in records} == {"L2, C=1.0 (lbfgs)"}
    encoder = tiny_loader("mean")  # the model behind the features, as a store's results name it
    assert (document["model_id"], document["layer_note"]) == (encoder.model_id, LAYER_NOTE)
    task = load_task("cola", cola)
    data = task_data(task, [0, 1], **SMALL)
    cache = FeatureCache(calibration / "features", tiny_loader, model=MODEL)
    for seed in (0, 1):
        rows = data.train_rows[seed]
        X = data.units(cache, "train", rows, pooling="mean", layers=None)[-1][:, 0]
        y = task.splits["train"].labels[rows]
        X_dev = data.units(cache, "dev", data.eval_rows["dev"], pooling="mean", layers=None)[-1][:, 0]
        whitening = make_calibrator("whitening", seed=seed).fit(X.astype(np.float64))
        head = LogisticRegression(C=1.0, max_iter=2000).fit(whitening.transform(X.astype(np.float64)), y)
        expected = matthews(task.splits["dev"].labels[data.eval_rows["dev"]],
                            head.predict(whitening.transform(X_dev.astype(np.float64))))
        (record,) = [r for r in records if r["seed"] == seed and r["method"] == "whitening" and r["split"] == "dev"]
        assert record["value"] == pytest.approx(expected, abs=1e-12)
        assert record["n_train"] == 60 and record["n_eval"] == 40
        # geometry of the evaluated sentence vectors before and after the calibration
        assert record["isoscore_before"] == pytest.approx(isoscore(X_dev.astype(np.float64)), abs=1e-9)
        assert record["isoscore_after"] == pytest.approx(isoscore(whitening.transform(X_dev.astype(np.float64))), abs=1e-9)
        assert record["log_iw_after"] == pytest.approx(log_partition_isotropy(whitening.transform(X_dev.astype(np.float64))), abs=1e-9)


def test_summaries_hold_the_paired_test_and_holm(calibration: Path, cola: Path) -> None:
    document = json.loads((calibration / "results.json").read_text())
    task = load_task("cola", cola)
    rows = task_data(task, [0], **SMALL).eval_rows["dev"]
    truth = task.splits["dev"].labels[rows]
    cells = [json.loads(p.read_text()) for p in (calibration / "cells").glob("*.json")]

    def predictions(method: str) -> np.ndarray:
        chosen = sorted((c for c in cells if c["config"]["method"] == method), key=lambda c: c["seed"])
        return np.array([c["predictions"]["dev"] for c in chosen])

    expected = paired_permutation_test(truth, predictions("none"), predictions("whitening"), matthews, n_resamples=2000)
    (summary,) = [s for s in document["summaries"] if s["method"] == "whitening" and s["split"] == "dev"]
    assert summary["p_value"] == pytest.approx(expected.p_value) and summary["pooled_difference"] == pytest.approx(expected.difference)
    assert summary["p_holm"] == pytest.approx(holm([expected.p_value])[0])  # one method against none
    dev = [r["value"] for r in document["records"] if r["method"] == "whitening" and r["split"] == "dev"]
    assert summary["mean"] == pytest.approx(np.mean(dev)) and summary["std"] == pytest.approx(np.std(dev, ddof=1))
    assert (calibration / "results.md").read_text().count("| cola |") == 4
    assert (calibration / "dev_matthews.png").exists() and (calibration / "dev_matthews.svg").exists()


def test_a_rerun_skips_finished_cells_and_bad_input_loses_nothing(calibration: Path, cola: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    before = json.loads((calibration / "results.json").read_text())["records"]
    from lmgeom.stages.experiments import calibration as module

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a finished cell was recomputed")

    monkeypatch.setattr(module, "fit_predict_sklearn", refuse)
    again = run_calibration(MODEL, "cola", cola, out=calibration, options=ExperimentOptions(seeds=2, device="cpu", **SMALL),
                            methods=["none", "whitening"], heads=["logreg"])
    assert again.records == before
    n_cells = len(list((calibration / "cells").glob("*.json")))
    with pytest.raises(ValueError, match=r"unknown calibration methods \['bogus'\]"):
        run_calibration(MODEL, "cola", cola, out=calibration, options=ExperimentOptions(seeds=2, device="cpu", **SMALL),
                        methods=["none", "bogus"], regime="both")
    assert len(list((calibration / "cells").glob("*.json"))) == n_cells


def test_the_feature_cache_encodes_each_text_once(tmp_path: Path) -> None:
    encoder = tiny_loader("mean")
    texts = ["A cat sat.", "Dogs bark loudly at night.", "Rain."]
    loads: list[str] = []

    def counting(pooling: str):  # type: ignore[no-untyped-def]
        loads.append(pooling)
        return encoder

    cache = FeatureCache(tmp_path, counting, model=MODEL)
    first = cache.sentence_vectors(texts[:2])
    np.testing.assert_array_equal(first, encoder.sentence_embeddings(texts[:2], include_special=False))
    both = FeatureCache(tmp_path, counting, model=MODEL).sentence_vectors(texts[::-1], layers=[0, 2])
    np.testing.assert_array_equal(both[:, 1:], first[[0, 2]][:, [1, 0]])  # old rows unchanged, order followed
    assert loads == ["mean", "mean"]  # the second cache loaded the model for "Rain." only
    never = FeatureCache(tmp_path, lambda pooling: pytest.fail("nothing is missing"), model=MODEL)  # type: ignore[arg-type,return-value]
    np.testing.assert_array_equal(never.sentence_vectors(texts)[:, :2], first)
    # the index records the model, so a cache that encodes nothing more still names it without loading it
    assert never.provenance() == {"model_id": encoder.model_id, "layer_note": LAYER_NOTE}
    words = [["The", "cat", "sat", "."], ["Rain", "."]]
    encoded = encoder.encode([__import__("lmgeom.corpus.corpus", fromlist=["Sentence"]).Sentence.from_words(w) for w in words])
    np.testing.assert_array_equal(cache.word_vectors(words), np.concatenate([e.vectors for e in encoded], axis=1))


def test_an_interrupted_extraction_resumes_with_the_same_vectors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmgeom.stages.experiments import features

    monkeypatch.setattr(features, "ENCODE_BATCH", 2)
    monkeypatch.setattr(features, "FLUSH_SECONDS", 0.0)  # written after every batch
    encoder = tiny_loader("mean")
    texts = [f"Sentence number {i} is here." for i in range(7)]
    whole = FeatureCache(tmp_path / "whole", lambda pooling: encoder, model=MODEL).sentence_vectors(texts)

    class Interrupted(Exception):
        pass

    calls: list[int] = []
    original = encoder.sentence_embeddings

    def failing(batch: list[str], **kwargs: Any) -> np.ndarray:
        calls.append(len(batch))
        if len(calls) == 3:
            raise Interrupted
        return original(batch, **kwargs)

    monkeypatch.setattr(encoder, "sentence_embeddings", failing)
    with pytest.raises(Interrupted):
        FeatureCache(tmp_path / "cut", lambda pooling: encoder, model=MODEL).sentence_vectors(texts)
    assert FeatureCache(tmp_path / "cut", tiny_loader, model=MODEL).n_layers("sentence-mean") is not None
    calls.clear()
    resumed = FeatureCache(tmp_path / "cut", lambda pooling: encoder, model=MODEL).sentence_vectors(texts)
    assert calls == [2, 1]  # the four sentences written before the interruption are not encoded again
    np.testing.assert_array_equal(resumed, whole)


@pytest.mark.processes
def test_the_probe_learns_the_informative_layer_and_repeats_in_a_new_process() -> None:
    X, y = synthetic_layers(0)
    mixed = fit_probe(X[:2500], y[:2500], {"test": X[2500:]}, regression=False, n_classes=3, seed=0, metric=matthews,
                      options=FAST_PROBE)
    assert np.argmax(mixed.mix_weights) == 1 and sum(mixed.mix_weights) == pytest.approx(1.0)
    assert np.mean(mixed.predictions["test"] == y[2500:]) > 0.95
    noise = fit_probe(X[:2500, [0]], y[:2500], {"test": X[2500:, [0]]}, regression=False, n_classes=3, seed=0,
                      metric=matthews, options=FAST_PROBE)
    assert np.mean(noise.predictions["test"] == y[2500:]) < 0.6
    code = ("import numpy as np, sys; sys.path.insert(0, 'tests'); from helpers import FAST_PROBE, synthetic_layers; "
            "from lmgeom.stages.experiments.heads import fit_probe; "
            "from lmgeom.evaluate.tasks import matthews; "
            "X, y = synthetic_layers(0); r = fit_probe(X[:2500], y[:2500], {'t': X[2500:]}, regression=False, n_classes=3, "
            "seed=0, metric=matthews, options=FAST_PROBE); print(r.mix_weights)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=Path(__file__).resolve().parents[1])
    assert json.loads(other.stdout) == mixed.mix_weights


def test_layers_on_pos_report_mix_weights_and_test_against_top(shared_data: Path, tmp_path: Path) -> None:
    result = run_layers(MODEL, "pos", shared_data / "UD_English-EWT", out=tmp_path, options=ExperimentOptions(seeds=1, max_train=40, max_eval=20, device="cpu"),
                        features=["layer:all", "top", "mix", "static"])
    features = {r["features"] for r in result.records}
    assert features == {"layer:0", "layer:1", "layer:2", "layer:3", "top", "mix", "static"}  # tiny-bert: layers 0-3
    (mix,) = [r for r in result.records if r["features"] == "mix"]
    assert len(mix["mix_weights"]) == 4 and sum(mix["mix_weights"]) == pytest.approx(1.0)
    value = {r["features"]: r["value"] for r in result.records}
    assert value["top"] == value["layer:3"] and value["static"] == value["layer:0"]  # same layer, seed and probe
    tested = {s["features"]: s for s in result.summaries}
    assert tested["layer:3"]["p_value"] == 1.0 and "p_value" not in tested["top"]
    assert all(0.0 < v <= 1.0 for v in value.values())
    assert "trained on en_ewt-ud-dev" in result.notes[0]


def test_cli_runs_the_experiment_with_the_list_spellings(cola: Path, tmp_path: Path) -> None:
    from lmgeom.cli.main import app

    runner = CliRunner()
    out = tmp_path / "cli"
    result = runner.invoke(app, ["experiment", "calibration", "--model", MODEL, "--task", "cola", "--data", str(cola),
                                 "--methods", "none,standardize", "--seeds", "0,3", "--heads", "logreg", "--max-train", "50",
                                 "--max-eval", "30", "--out", str(out), "--device", "cpu"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    document = json.loads((out / "results.json").read_text())
    assert document["settings"]["seeds"] == [0, 3] and document["settings"]["methods"] == ["none", "standardize"]
    assert max(len(line) for line in result.output.splitlines()) <= 80
    bad = runner.invoke(app, ["experiment", "calibration", "--model", MODEL, "--task", "cola", "--data", str(tmp_path),
                              "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "missing in_domain_train.tsv" in bad.output
    unknown = runner.invoke(app, ["experiment", "layers", "--model", MODEL, "--task", "cola", "--data", str(cola),
                                  "--features", "layer:9", "--out", str(tmp_path / "l"), "--max-train", "5", "--max-eval", "5"])
    assert unknown.exit_code == 2 and "layer:9" in unknown.output
    for command in ("calibrate", "sts"):
        help_text = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        assert "--methods" in help_text and not re.search(r"--method(?![\w-])", help_text)  # the old spelling is hidden


def test_the_report_reads_the_experiment_per_head_and_split(calibration: Path) -> None:
    from lmgeom.report.data import read_experiments, summarise_experiments

    files = [calibration / "results.json"]
    table = summarise_experiments(read_experiments(files), read_experiments(files, part="summaries"))  # type: ignore[arg-type]
    assert len(table) == 4 and set(table["n"]) == {2}  # (none, whitening) x (dev, dev_out_of_domain), 2 seeds each
    summaries = json.loads((calibration / "results.json").read_text())["summaries"]
    for s in summaries:
        row = table[(table["method"] == s["method"]) & (table["split"] == s["split"])].iloc[0]
        assert row["mean"] == pytest.approx(s["mean"])
        assert (np.isnan(row["p"]) if s.get("p_holm") is None else row["p"] == pytest.approx(s["p_holm"]))


def test_the_finetuning_regime_runs_lmgeom_finetune_per_method_and_seed(cola: Path, tmp_path: Path) -> None:
    from lmgeom.finetune import FineTuneOptions, finetune
    from lmgeom.stages.experiments.finetuning import finetune_task

    options = {"epochs": 1, "batch_size": 16, "max_length": 32}
    result = run_calibration(MODEL, "cola", cola, out=tmp_path, options=ExperimentOptions(seeds=1, max_train=40, max_eval=20, device="cpu"),
                             methods=["none", "whitening", "isobn"], regime="finetune", finetune_options=options,
                             validation_fraction=0.25, workers=1)
    assert {r["method"] for r in result.records} == {"none", "whitening", "isobn"}
    assert {r["regime"] for r in result.records} == {"finetune"}
    task = finetune_task(load_task("cola", cola), max_train=40, validation_fraction=0.25).task
    data = task_data(task, [0], max_train=None, max_eval=20)
    train = task.splits["train"]
    assert len(train.inputs) == 30 and len(task.splits["validation"].inputs) == 10
    direct = finetune(MODEL, train_inputs=train.inputs, train_labels=train.labels,
                      eval_inputs={s: [task.splits[s].inputs[r] for r in data.eval_rows[s]] for s in data.eval_rows},
                      n_outputs=2, method="none", options=FineTuneOptions(seed=0, device="cpu", pooling="mean", **options))
    (none_dev,) = [r for r in result.records if r["method"] == "none" and r["split"] == "dev"]
    truth = task.splits["dev"].labels[data.eval_rows["dev"]]
    assert none_dev["value"] == pytest.approx(matthews(truth, direct.predictions["dev"]), abs=1e-12)
    assert none_dev["isoscore_pretrained"] == pytest.approx(isoscore(direct.sentence_vectors["before"]["dev"].astype(np.float64)), abs=1e-9)
    # `none` has no layer: the head's input before and after it is the fine-tuned pooled vector
    assert none_dev["isoscore_before"] == none_dev["isoscore_after"]
    assert none_dev["isoscore_after"] == pytest.approx(isoscore(direct.sentence_vectors["after"]["dev"].astype(np.float64)), abs=1e-9)
    assert {r["split"] for r in result.records} == {"dev", "dev_out_of_domain", "validation"}
    (white_dev,) = [r for r in result.records if r["method"] == "whitening" and r["split"] == "dev"]
    assert white_dev["isoscore_after"] != white_dev["isoscore_before"] and white_dev["degenerate"] in (True, False)
    assert white_dev["n_steps"] == 2 and white_dev["seconds_per_step"] > 0
    tested = {s["method"]: s for s in result.summaries if s["split"] == "dev"}
    assert tested["whitening"].get("degenerate") or tested["whitening"]["p_holm"] >= tested["whitening"]["p_value"]


def test_pos_calibrator_sees_only_training_words_and_a_rerun_skips_finished_cells(
        shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmgeom.stages.experiments import calibration as module

    ewt = shared_data / "UD_English-EWT"
    fitted: list[object] = []

    def recording(method: str, **kwargs: Any) -> Any:
        calibrator = make_calibrator(method, **kwargs)
        fitted.append(calibrator)
        return calibrator

    monkeypatch.setattr(module, "make_calibrator", recording)
    sizes: dict[str, Any] = {"max_train": 30, "max_eval": 12}
    result = run_calibration(MODEL, "pos", ewt, out=tmp_path, options=ExperimentOptions(seeds=(3,),
                             device="cpu", **sizes), methods=["none", "whitening", "isobn"], heads=["logreg"])
    task = load_task("pos", ewt)
    data = task_data(task, [3], **sizes)
    cache = FeatureCache(tmp_path / "features", tiny_loader, model=MODEL)
    X = data.units(cache, "train", data.train_rows[3], pooling="mean", layers=None)[-1][:, 0].astype(np.float64)
    X_test = data.units(cache, "test", data.eval_rows["test"], pooling="mean", layers=None)[-1][:, 0].astype(np.float64)
    y, truth = data.labels("train", data.train_rows[3]), data.labels("test", data.eval_rows["test"])
    tagged = task.splits["train"]
    assert isinstance(tagged, TaggedSplit)
    n_words = sum(len(tagged.tags[r]) for r in data.train_rows[3])
    assert X.shape[0] == len(y) == n_words and X_test.shape[0] == len(truth) > sizes["max_eval"]
    # the whitening was fitted on the training words, every one of them and nothing else
    (whitening,) = fitted
    assert whitening.n_samples_seen_ == n_words  # type: ignore[attr-defined]
    np.testing.assert_allclose(whitening.mean_, X.mean(axis=0), rtol=0, atol=1e-9)  # type: ignore[attr-defined]
    np.testing.assert_allclose(whitening.explained_variance_[0], np.linalg.eigvalsh(np.cov(X.T))[-1],  # type: ignore[attr-defined]
                               rtol=1e-7)
    assert not np.allclose(whitening.mean_, np.vstack([X, X_test]).mean(axis=0), atol=1e-6)  # type: ignore[attr-defined]
    # accuracy over the evaluation words equals a hand-made whitening + logistic regression
    expected = {}
    for method, features, evaluated in (("none", X, X_test), ("whitening", whitening.transform(X), whitening.transform(X_test))):  # type: ignore[attr-defined]
        predicted = LogisticRegression(C=1.0, max_iter=2000).fit(features, y).predict(evaluated)
        expected[method] = predicted
        (record,) = [r for r in result.records if r["method"] == method]
        assert record["value"] == pytest.approx(np.mean(predicted == truth), abs=1e-12)
        assert record["n_train"] == n_words and record["n_eval"] == len(truth) and record["metric"] == "accuracy"
    # the paired permutation test runs over the evaluation words
    (summary,) = [s for s in result.summaries if s["method"] == "whitening"]
    from lmgeom.evaluate.tasks import METRICS

    reference = paired_permutation_test(truth, expected["none"][None], expected["whitening"][None], METRICS["accuracy"],
                                        n_resamples=2000)
    assert summary["p_value"] == pytest.approx(reference.p_value) and f"over {len(truth)} evaluation examples" in summary["test"]
    document = json.loads((tmp_path / "results.json").read_text())
    assert document["settings"]["train_words"] == {"3": n_words} and document["settings"]["pooling"].startswith("word vectors")
    assert any("isobn" in note and "skipped" in note for note in document["notes"])
    # a re-run with one more method fits only that method's calibrator
    fitted.clear()
    again = run_calibration(MODEL, "pos", ewt, out=tmp_path, options=ExperimentOptions(seeds=(3,),
                            device="cpu", **sizes), methods=["none", "whitening", "abtt"], heads=["logreg"])
    assert [type(c).__name__ for c in fitted] == ["AllButTheTop"]
    assert [r for r in again.records if r["method"] != "abtt"] == result.records
    # the fine-tuning regime fine-tunes a sentence head: refused up front for a tagging task
    for regime in ("finetune", "both"):
        with pytest.raises(ValueError, match="token-tagging task.*`regime='frozen'`"):
            run_calibration(MODEL, "pos", ewt, out=tmp_path / regime, options=ExperimentOptions(seeds=1, device="cpu"),
                            methods=["none"], regime=regime)
        assert not (tmp_path / regime).exists()


def test_the_finetuning_regime_refuses_an_elmo_model_up_front(cola: Path, tmp_path: Path) -> None:
    for regime in ("finetune", "both"):
        with pytest.raises(ValueError, match="elmo-brown is an ELMo model.*`regime='frozen'`"):
            run_calibration("elmo-brown", "cola", cola, out=tmp_path / regime, options=ExperimentOptions(seeds=1, device="cpu"),
                            methods=["none"], regime=regime)
        assert not (tmp_path / regime).exists()


def test_experiments_are_reachable_from_the_top_level_package() -> None:
    import lmgeom
    from lmgeom.stages.experiments import run_calibration, run_layers

    assert lmgeom.experiments.run_calibration is run_calibration is lmgeom.run_calibration
    assert lmgeom.experiments.run_layers is run_layers is lmgeom.run_layers
