"""The fine-tuning recipe of the calibration experiment: length-grouped batches, the warm-up schedule,
the validation split, degenerate layers, resumable worker cells, Δ of means, Holm without duplicate
tests and the local-isotropy thesis test."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from lmgeom.evaluate.stats import difference_of_means, holm, holm_unique, spearman_bootstrap
from lmgeom.evaluate.tasks import SentenceSplit, SentenceTask
from lmgeom.finetune.train import length_grouped_batches, padding_fraction, random_batches, warmup_linear
from lmgeom.stages.experiments import finetuning
from lmgeom.stages.experiments.core import Cell, CellStore, TaskData, geometry, summarise
from lmgeom.stages.experiments.finetuning import (
    VALIDATION_SPLIT,
    FinetuneJob,
    degenerate_reasons,
    finetune_task,
    reassessed,
    run_jobs,
)
from lmgeom.stages.experiments.thesis import thesis_pairs, thesis_test


def lengths_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(5, 128, size=n)


def test_length_grouping_covers_every_example_once_and_pads_less():
    lengths = lengths_of(2000)
    batches = length_grouped_batches(lengths, 32, np.random.default_rng(3))
    flat = [row for rows in batches for row in rows]
    assert sorted(flat) == list(range(2000))
    assert all(1 <= len(rows) <= 32 for rows in batches)
    grouped = padding_fraction(lengths, batches)
    shuffled = padding_fraction(lengths, random_batches(2000, 32, np.random.default_rng(3)))
    # random batches of uniform 5..127 lengths pad about half of every batch; grouped ones a few %
    assert shuffled > 0.35 and grouped < 0.05
    # brute force: the padding of one batch is its size times its longest row minus its lengths
    rows = batches[0]
    assert padding_fraction(lengths, [rows]) == pytest.approx(1 - lengths[rows].sum() / (len(rows) * lengths[rows].max()))


def test_length_grouping_is_seeded_and_changes_between_epochs():
    lengths = lengths_of(500)
    first = length_grouped_batches(lengths, 16, np.random.default_rng(7))
    assert first == length_grouped_batches(lengths, 16, np.random.default_rng(7))
    rng = np.random.default_rng(7)
    assert length_grouped_batches(lengths, 16, rng) != length_grouped_batches(lengths, 16, rng)


def test_warmup_then_linear_decay():
    factors = [warmup_linear(step, 100, 6) for step in range(100)]
    assert factors[:7] == pytest.approx([0, 1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0])
    assert factors[53] == pytest.approx(47 / 94)
    assert factors[99] == pytest.approx(1 / 94)
    # no warm-up is the old linear decay 1 - step / total
    assert [warmup_linear(s, 10, 0) for s in range(10)] == pytest.approx([1 - s / 10 for s in range(10)])


def small_task(n_train: int = 200) -> SentenceTask:
    train = SentenceSplit([f"train sentence {i}" for i in range(n_train)], np.arange(n_train) % 2)
    dev = SentenceSplit([f"dev sentence {i}" for i in range(40)], np.arange(40) % 2)
    test = SentenceSplit([f"test sentence {i}" for i in range(30)], np.arange(30) % 2)
    return SentenceTask("toy", "classification", False, {"train": train, "dev": dev, "test": test}, ("accuracy",))


def test_validation_split_is_disjoint_from_train_and_eval():
    task = small_task()
    split = finetune_task(task, max_train=None, validation_fraction=0.1)
    parts = split.task.splits
    assert list(parts) == ["train", "dev", "test", VALIDATION_SPLIT]
    train, validation = set(parts["train"].inputs), set(parts[VALIDATION_SPLIT].inputs)
    assert len(validation) == 20 and len(train) == 180
    assert not train & validation
    assert train | validation == set(task.splits["train"].inputs)
    for name in ("dev", "test"):
        assert parts[name] is task.splits[name]
        assert not set(parts[name].inputs) & (train | validation)
    # labels travel with their inputs
    for part in (parts["train"], parts[VALIDATION_SPLIT]):
        assert [int(s.split()[-1]) % 2 for s in part.inputs] == part.labels.tolist()
    # the same rows every time (shared by every seed and method), a subsample first when asked
    assert finetune_task(task, max_train=None, validation_fraction=0.1).task.splits["train"].inputs == parts["train"].inputs
    sub = finetune_task(task, max_train=50, validation_fraction=0.2).task.splits
    assert len(sub["train"].inputs) == 40 and len(sub[VALIDATION_SPLIT].inputs) == 10
    with pytest.raises(ValueError, match="validation_fraction"):
        finetune_task(task, max_train=None, validation_fraction=1.0)


def test_degenerate_flag_on_planted_collapses():
    rng = np.random.default_rng(0)
    healthy = rng.normal(size=(400, 16))
    assert degenerate_reasons(healthy, geometry(healthy)) == []
    collapsed = rng.normal(size=(400, 1)) * rng.normal(size=(1, 16)) + 1e-6 * rng.normal(size=(400, 16))
    reasons = degenerate_reasons(collapsed, geometry(collapsed))
    assert any("IsoScore" in r for r in reasons)
    dead = healthy.copy()
    dead[:, 3] = 2.5
    assert any("std ~ 0" in r for r in degenerate_reasons(dead, geometry(dead)))
    blown = healthy.copy()
    blown[:, 0] *= 1e30  # the flow's failure mode: one direction scaled far beyond the others
    measures = geometry(blown)
    assert abs(measures["log_iw"]) > 100
    assert any("log I(W)" in r for r in degenerate_reasons(blown, measures))
    broken = healthy.copy()
    broken[5, 2] = np.nan
    assert degenerate_reasons(broken, {"isoscore": 0.5, "log_iw": -1.0}) == ["non-finite values"]


def test_isotropy_thresholds_judge_a_layer_only():
    rng = np.random.default_rng(0)
    # a fine-tuned classifier's pooled vectors: two tight clusters along one direction, as anisotropic
    # as the task rewards; a failure for a calibrating layer, the task's own shape for `none`/`istar`
    direction = rng.normal(size=(1, 16))
    clustered = np.where(rng.random((400, 1)) < 0.5, -1.0, 1.0) * direction + 1e-3 * rng.normal(size=(400, 16))
    measures = geometry(clustered)
    assert measures["isoscore"] < 0.01
    assert any(r.startswith("IsoScore") for r in degenerate_reasons(clustered, measures, layer=True))
    assert degenerate_reasons(clustered, measures, layer=False) == []
    dead = clustered.copy()
    dead[:, 0] = 1.0
    assert any("std ~ 0" in r for r in degenerate_reasons(dead, geometry(dead), layer=False))
    # a cell saved by the rule that judged every method: reassessed by its method on reading
    saved = Cell({"method": "none"}, 0, records=[{"split": "dev", "metric": "f1", "value": 0.8, "degenerate": True}],
                 extra={"degenerate_reasons": ["IsoScore 0.002 < 0.01", "|log I(W)| = 120 > 100"]})
    fresh = reassessed(saved, "none")
    assert fresh.records[0]["degenerate"] is False and fresh.extra["degenerate_reasons"] == []
    assert fresh.extra["degenerate_reasons_saved"] == saved.extra["degenerate_reasons"]
    assert reassessed(saved, "whitening") is saved
    training = Cell({"method": "istar"}, 0, records=[{"degenerate": True}], extra={"degenerate_reasons": ["non-finite values"]})
    assert reassessed(training, "istar").records[0]["degenerate"] is True


def test_a_layer_no_less_isotropic_than_its_input_has_not_collapsed_it():
    """A binary task's fine-tuned vectors lie near one direction (IsoScore ~ 0.002 for `none` on SST-2):
    a layer whose output keeps or raises that IsoScore is not degenerate for being below 0.01; one
    that lowers it below 0.01 is."""
    rng = np.random.default_rng(1)
    direction = rng.normal(size=(1, 16))
    clustered = np.where(rng.random((400, 1)) < 0.5, -1.0, 1.0) * direction + 1e-3 * rng.normal(size=(400, 16))
    measures = geometry(clustered)
    assert measures["isoscore"] < 0.01
    assert degenerate_reasons(clustered, measures, input_isoscore=measures["isoscore"] / 2) == []
    assert degenerate_reasons(clustered, measures, input_isoscore=measures["isoscore"]) == []
    [reason] = degenerate_reasons(clustered, measures, input_isoscore=0.3)
    assert reason.startswith("IsoScore") and "below its input's 0.3" in reason
    # saved cells judged again on reading, from the isotropy their records hold
    def cell(after, before, reasons):
        records = [{"split": "dev", "metric": "accuracy", "value": 0.87, "degenerate": True,
                    "isoscore_after": after, "isoscore_before": before}]
        return Cell({"method": "isobn"}, 0, records=records, extra={"degenerate_reasons": reasons})

    kept_up = reassessed(cell(0.0035, 0.0014, ["IsoScore 0.00355 < 0.01"]), "isobn")
    assert kept_up.records[0]["degenerate"] is False and kept_up.extra["degenerate_reasons"] == []
    lowered = cell(0.003, 0.2, ["IsoScore 0.003 < 0.01"])
    assert reassessed(lowered, "isobn") is lowered
    stale = ["collapsed during training: the fit in use before step 400 gave IsoScore 0.0028, log I(W) -134"]
    assert reassessed(cell(0.48, 0.002, ["IsoScore 0.48 < 0.01", *stale]), "whitening").extra["degenerate_reasons"] == stale


def test_difference_of_means_and_holm_without_duplicates():
    delta, seeds = difference_of_means({0: 0.5, 1: 0.7, 2: 0.9}, {0: 0.4, 1: 0.4, 3: 1.0})
    assert seeds == [0, 1] and delta == pytest.approx(0.6 - 0.4)
    assert np.isnan(difference_of_means({0: 1.0}, {1: 1.0})[0])
    adjusted, duplicate_of = holm_unique([0.01, 0.04, 0.01], ["layer 6", "layer 3", "layer 6"])
    # two distinct tests: 0.01 * 2 = 0.02, then max(0.02, 0.04 * 1); the duplicate shares the first's
    assert adjusted.tolist() == pytest.approx([0.02, 0.04, 0.02])
    assert duplicate_of == [None, None, 0]
    assert holm([0.01, 0.04, 0.01]).tolist() == pytest.approx([0.03, 0.04, 0.03])  # what the duplicate cost


def toy_cells() -> tuple[list[Cell], TaskData]:
    """Three seeds of none, a method, and a copy of the method (identical predictions), on 40 dev examples."""
    task = small_task()
    truth = task.splits["dev"].labels
    data = TaskData(task, {s: np.arange(200) for s in range(3)}, {"dev": np.arange(40)}, {"max_train": None, "max_eval": None})
    rng = np.random.default_rng(1)
    cells = []
    for seed in range(3):
        none = np.where(rng.random(40) < 0.7, truth, 1 - truth)
        better = np.where(rng.random(40) < 0.9, truth, 1 - truth)
        for method, prediction in (("none", none), ("whitening", better), ("whitening-copy", better)):
            value = float(np.mean(prediction == truth))
            record = {"experiment": "calibration", "task": "toy", "method": method, "seed": seed, "split": "dev",
                      "metric": "accuracy", "value": value}
            cells.append(Cell({"method": method}, seed, [record], {"dev": prediction.tolist()}))
    return cells, data


def test_summaries_give_difference_of_means_pooled_statistic_and_dedup_holm():
    cells, data = toy_cells()
    summaries = summarise(cells, data, baseline=lambda row: None if row["method"] == "none" else {"method": "none"},
                          family_key="method", n_resamples=200)
    rows = {s["method"]: s for s in summaries}
    values = {m: [c.records[0]["value"] for c in cells if c.config["method"] == m] for m in rows}
    assert rows["whitening"]["difference"] == pytest.approx(np.mean(values["whitening"]) - np.mean(values["none"]))
    truth = np.tile(data.task.splits["dev"].labels, 3)
    pooled = {m: np.concatenate([c.predictions["dev"] for c in cells if c.config["method"] == m]) for m in rows}
    assert rows["whitening"]["pooled_difference"] == pytest.approx(np.mean(pooled["whitening"] == truth)
                                                                   - np.mean(pooled["none"] == truth))
    assert all(rows[m]["n_seeds"] == 3 and "std" in rows[m] for m in rows)
    # the copy is the same test: one hypothesis in the family, so no Holm penalty for it
    assert rows["whitening"]["holm_family_size"] == 1
    assert rows["whitening-copy"]["holm_duplicate_of"] == "whitening"
    assert rows["whitening"]["p_holm"] == pytest.approx(rows["whitening"]["p_value"])
    assert rows["whitening-copy"]["p_holm"] == rows["whitening"]["p_holm"]


def test_a_degenerate_configuration_is_a_failure_not_a_result():
    cells, data = toy_cells()
    for cell in cells:
        if cell.config["method"] == "whitening" and cell.seed == 1:
            cell.records[0]["degenerate"] = True
    summaries = summarise(cells, data, baseline=lambda row: None if row["method"] == "none" else {"method": "none"},
                          family_key="method", n_resamples=200)
    rows = {s["method"]: s for s in summaries}
    assert rows["whitening"]["degenerate"] is True and rows["whitening"]["degenerate_seeds"] == [1]
    assert rows["whitening"]["p_value"] is None and "p_holm" not in rows["whitening"]
    assert "degenerate" in rows["whitening"]["test"]
    assert "degenerate" not in rows["whitening-copy"]


def test_resume_skips_finished_cells(tmp_path, monkeypatch):
    store = CellStore(tmp_path)
    jobs = [FinetuneJob("tiny-bert", {"method": m, "task": "toy"}, {}, m, 0, {}, [], np.zeros(0), {}, {}, 2, ("accuracy",), "dev")
            for m in ("none", "whitening", "flow")]
    store.save(Cell(jobs[1].config, 0, [{"value": 0.5}], {"dev": [1, 0]}, {"seconds": 1.0}))
    ran = []

    def fake(job: FinetuneJob) -> Cell:
        ran.append(job.method)
        return Cell(job.config, job.seed, [{"value": 0.7}], {"dev": [0, 0]}, {"seconds": 2.0})

    monkeypatch.setattr(finetuning, "run_job", fake)
    cells = run_jobs(jobs, store, workers=1)
    assert ran == ["none", "flow"]
    assert [c.config["method"] for c in cells] == ["none", "whitening", "flow"]
    assert cells[1].records == [{"value": 0.5}]
    ran.clear()
    again = run_jobs(jobs, store, workers=1)
    assert ran == [] and [c.records for c in again] == [c.records for c in cells]


def test_thesis_test_finds_a_planted_relation_and_not_an_absent_one():
    rng = np.random.default_rng(0)
    records = []
    for regime in ("frozen", "finetune"):
        for task in ("cola", "rte"):
            for seed in range(3):
                records.append({"regime": regime, "task": task, "method": "none", "seed": seed, "split": "dev",
                                "metric": "accuracy", "value": 0.6, "isoscore_after": 0.2, "local_isoscore_after": 0.1})
                for method in ("whitening", "cie", "flow", "isobn"):
                    local = rng.normal()
                    planted = 0.1 + 0.05 * local if regime == "frozen" else 0.6 + 0.05 * rng.normal()
                    records.append({"regime": regime, "task": task, "method": method, "seed": seed, "split": "dev",
                                    "metric": "accuracy", "value": planted, "isoscore_after": 0.2 + rng.normal(),
                                    "local_isoscore_after": 0.1 + local, "degenerate": False})
                    records.append({**records[-1], "split": "validation", "value": 0.0})  # never paired
    records.append({**records[-2], "method": "istar", "degenerate": True})  # left out
    pairs = thesis_pairs(records)
    assert len(pairs) == 2 * 2 * 3 * 4
    frozen = pairs[pairs["regime"] == "frozen"]
    # Δ score = (0.1 + 0.05 local) - 0.6 and Δ local = (0.1 + local) - 0.1 by construction
    assert frozen["delta_score"].to_numpy() == pytest.approx(-0.5 + 0.05 * frozen["delta_local"].to_numpy())
    results = {(r["regime"], r["measure"]): r for r in thesis_test(pairs, n_resamples=300)}
    local = results[("frozen", "local")]
    assert local["rho"] == pytest.approx(1.0) and local["low"] > 0.9
    assert local["rho"] == pytest.approx(scipy_stats.spearmanr(frozen["delta_local"], frozen["delta_score"]).statistic)
    tuned = results[("finetune", "local")]
    assert tuned["n_pairs"] == 24 and tuned["low"] < 0 < tuned["high"]


def test_spearman_bootstrap_against_scipy():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    y = np.array([2.0, 1.0, 4.0, 3.0, 6.0, 5.0])
    result = spearman_bootstrap(x, y, n_resamples=500)
    assert result.rho == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert result.low <= result.rho <= result.high and result.n == 6
    with pytest.raises(ValueError, match="at least 3"):
        spearman_bootstrap([1.0, 2.0], [1.0, 2.0])



def test_chosen_setting_refuses_unfinished_or_uninformative_prechecks(tmp_path):
    import json

    from lmgeom.stages.experiments.finetuning import chosen_setting

    def write(chosen: dict) -> None:
        (tmp_path / "precheck.json").write_text(json.dumps({"tasks": {"cola": {"chosen": chosen}}}))

    write({"learning_rate": 5e-5, "epochs": 3, "complete": True, "informative": True})
    assert chosen_setting(tmp_path, "CoLA") == {"learning_rate": 5e-5, "epochs": 3, "max_train": None,
                                                "validation_fraction": 0.1}
    write({"learning_rate": 5e-5, "epochs": 3, "complete": False, "informative": True})
    with pytest.raises(ValueError, match="has not run every setting"):
        chosen_setting(tmp_path, "cola")
    write({"learning_rate": 5e-5, "epochs": 3, "complete": True, "informative": False})
    with pytest.raises(ValueError, match="does not beat the trivial baseline"):
        chosen_setting(tmp_path, "cola")
    with pytest.raises(ValueError, match="no setting chosen for rte"):
        chosen_setting(tmp_path, "rte")


def test_whitening_inside_fine_tuning_is_zca_so_refits_are_continuous():
    from lmgeom.finetune.train import _method_settings

    settings, make = _method_settings("whitening", {}, seed=0, device="cpu")
    assert settings["zca"] is True and make is not None and make().zca is True
    assert _method_settings("whitening", {"zca": False}, seed=0, device="cpu")[0]["zca"] is False
    # a re-fit on slightly moved vectors gives a nearby map (PCA whitening may flip its axes' signs)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 6)) @ rng.normal(size=(6, 6))
    first, second = make().fit(X), make().fit(X + 1e-3 * rng.normal(size=X.shape))
    assert np.abs(first.transform(X) - second.transform(X)).max() < 0.05


def test_a_flow_refit_continues_the_previous_flow():
    import torch

    from lmgeom.calibrate import FlowCalibrator
    from lmgeom.finetune.calibration import CalibrationLayer, ContinuedFlow

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 8)) @ rng.normal(size=(8, 8)) + np.sin(rng.normal(size=(600, 8)))
    moved = X + 0.01 * rng.normal(size=X.shape)
    make = lambda: FlowCalibrator(n_epochs=3, hidden_size=16, n_steps=2, random_state=0, device="cpu")  # noqa: E731
    layer = CalibrationLayer(make, continue_flow=True)
    layer.refit(X)
    first = layer.calibrator
    before = first.transform(X)
    layer.refit(moved)
    continued = layer.calibrator
    assert isinstance(continued, ContinuedFlow) and continued.prewhitening_ is first.prewhitening_
    fresh = FlowCalibrator(n_epochs=3, hidden_size=16, n_steps=2, random_state=1, device="cpu").fit(moved)
    drift = np.abs(continued.transform(X) - before).mean()
    assert drift < 0.5 * np.abs(fresh.transform(X) - before).mean()
    # the torch form is the continued calibrator's transform, and the first fit's module is untouched
    with torch.no_grad():
        torch_out = layer(torch.as_tensor(X[:50], dtype=torch.float32)).numpy()
    assert np.abs(torch_out - continued.transform(X[:50])).max() < 1e-3
    assert np.array_equal(first.transform(X), before)


def test_a_layer_that_collapsed_during_training_is_degenerate():
    from lmgeom.stages.experiments.finetuning import stale_layer_reasons

    healthy = {"step": 50, "finite": True, "isoscore": 0.3, "log_iw": -30.0}
    assert stale_layer_reasons([healthy]) == []
    # the flow probe's stale fit: IsoScore 0.0001, log I(W) -9.2e6 on the encoder's vectors at step 64
    collapsed = {"step": 64, "finite": True, "isoscore": 0.0001, "log_iw": -9.2e6}
    (reason,) = stale_layer_reasons([healthy, collapsed])
    assert "before step 64" in reason
    assert len(stale_layer_reasons([{"step": 3, "finite": False, "isoscore": float("nan"), "log_iw": float("nan")}])) == 1
    assert len(stale_layer_reasons([{"step": 3, "finite": True, "isoscore": 0.5, "log_iw": -150.0}])) == 1


def test_finetune_records_the_layer_before_every_refit():
    from lmgeom.finetune import FineTuneOptions, finetune

    texts = [f"The cat number {i} sat on the mat {i % 5} times." for i in range(40)]
    result = finetune("tiny-bert", train_inputs=texts, train_labels=np.arange(40) % 2, eval_inputs={"dev": texts[:8]},
                      n_outputs=2, method="standardize",
                      options=FineTuneOptions(epochs=1, batch_size=8, learning_rate=1e-3, recalibrate_every=2,
                                              max_length=32, device="cpu"))
    # 5 steps: fits before steps 0, 2, 4 and after step 5; checks before the re-fits at 2, 4 and after the last step
    assert [c["step"] for c in result.layer_checks] == [2, 4, 5]
    assert all(c["finite"] and 0 < c["isoscore"] <= 1 for c in result.layer_checks)
    assert result.n_steps == 5 and 0 <= result.padding_fraction < 0.5


def test_the_calibration_command_takes_the_prechecked_setting(shared_data, tmp_path):
    import json

    from typer.testing import CliRunner

    from lmgeom.cli.main import app

    precheck = tmp_path / "precheck"
    precheck.mkdir()
    (precheck / "precheck.json").write_text(json.dumps({"tasks": {"cola": {"chosen": {
        "learning_rate": 7e-4, "epochs": 1, "complete": True, "informative": True}}}}))
    out = tmp_path / "grid"
    result = CliRunner().invoke(app, [
        "experiment", "calibration", "--model", "tiny-bert", "--task", "cola", "--data", str(shared_data / "GLUE" / "CoLA"),
        "--regime", "finetune", "--methods", "none", "--seeds", "1", "--max-train", "40", "--max-eval", "10",
        "--max-steps", "2", "--max-length", "32", "--num-workers", "1", "--device", "cpu", "--precheck", str(precheck),
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads((out / "results.json").read_text())
    (cell,) = document["cells"]
    assert cell["config"]["options"]["learning_rate"] == 7e-4 and cell["config"]["options"]["epochs"] == 1
    assert cell["n_steps"] == 2 and cell["seconds"] > 0 and cell["degenerate_reasons"] == []
    assert {r["split"] for r in document["records"]} == {"dev", "dev_out_of_domain", "validation"}
    assert all("lr 0.0007" in r["head_regularisation"] for r in document["records"])
    # the pre-check's training subsample is the grid's: taken when --max-train is left out, refused when it differs
    (precheck / "precheck.json").write_text(json.dumps({"tasks": {"cola": {"sizes": {
        "max_train": 40, "validation_fraction": 0.1}, "chosen": {
        "learning_rate": 7e-4, "epochs": 1, "complete": True, "informative": True}}}}))
    refused = CliRunner().invoke(app, [
        "experiment", "calibration", "--model", "tiny-bert", "--task", "cola", "--data", str(shared_data / "GLUE" / "CoLA"),
        "--regime", "finetune", "--methods", "none", "--seeds", "1", "--max-train", "30", "--max-steps", "2",
        "--device", "cpu", "--precheck", str(precheck), "--out", str(tmp_path / "other")])
    assert refused.exit_code == 2 and "--max-train 30 differs from the 40" in refused.output
    taken = CliRunner().invoke(app, [
        "experiment", "calibration", "--model", "tiny-bert", "--task", "cola", "--data", str(shared_data / "GLUE" / "CoLA"),
        "--regime", "finetune", "--methods", "none", "--seeds", "1", "--max-eval", "10", "--max-steps", "2",
        "--max-length", "32", "--num-workers", "1", "--device", "cpu", "--precheck", str(precheck), "--out", str(out)])
    assert taken.exit_code == 0, taken.output
    document = json.loads((out / "results.json").read_text())
    (cell,) = document["cells"]
    assert cell["config"]["max_train"] == 40 and {r["n_train"] for r in document["records"]} == {36}


def test_the_precheck_chooses_per_task_rates_and_flags_an_edge(shared_data, tmp_path):
    import json

    from lmgeom.stages.experiments.finetuning import run_precheck

    options = {"max_steps": 2, "max_length": 32, "batch_size": 8, "device": "cpu"}
    kwargs = dict(tasks=["cola"], learning_rates=[1e-5], task_learning_rates={"cola": [1e-3, 3e-3]}, epochs={"cola": [1]},
                  max_train={"cola": 60}, options=options, workers=1)
    summary = run_precheck("tiny-bert", shared_data / "GLUE", out=tmp_path, **kwargs)
    entry = summary["tasks"]["cola"]
    assert summary["learning_rates"] == {"cola": [1e-3, 3e-3]} and entry["n_settings"] == 2
    assert sorted(s["learning_rate"] for s in entry["settings"]) == [1e-3, 3e-3]
    assert entry["sizes"] == {"max_train": 60, "validation_fraction": 0.1} and entry["n_train"] == 54
    chosen = entry["chosen"]
    best = max(entry["settings"], key=lambda s: (s["scores"]["validation"]["matthews"], -s["learning_rate"]))
    assert (chosen["learning_rate"], chosen["complete"]) == (best["learning_rate"], True)
    assert chosen["at_edge"] is True  # two rates: either choice is an edge
    assert "at the edge of the learning-rate range" in (tmp_path / "precheck.md").read_text()
    assert json.loads((tmp_path / "precheck.json").read_text()) == json.loads(json.dumps(summary))
    # resumed: nothing runs again, the same summary comes back
    cells = sorted((tmp_path / "cells").iterdir())
    stamps = [c.stat().st_mtime_ns for c in cells]
    assert run_precheck("tiny-bert", shared_data / "GLUE", out=tmp_path, **kwargs) == summary
    assert [c.stat().st_mtime_ns for c in sorted((tmp_path / "cells").iterdir())] == stamps


def test_the_precheck_reads_sick_entailment_beside_the_glue_folder(shared_data, tmp_path, monkeypatch):
    from lmgeom.stages.experiments import finetuning
    from lmgeom.stages.experiments.finetuning import run_precheck

    seen = []

    def truth(job: FinetuneJob) -> Cell:  # predicts the labels: no model is trained
        seen.append(job)
        records = [{**job.base, "split": s, "metric": "accuracy", "value": 1.0} for s in job.eval_labels]
        return Cell(job.config, job.seed, records, {s: y.tolist() for s, y in job.eval_labels.items()},
                    {"seconds": 1.0, "seconds_per_step": 1.0, "n_steps": 1, "padding_fraction": 0.0})

    monkeypatch.setattr(finetuning, "run_job", truth)
    summary = run_precheck("tiny-bert", shared_data / "GLUE", out=tmp_path, tasks=["sicke"], learning_rates=[1e-3],
                           task_learning_rates={"sicke": [1e-3]}, epochs={"sicke": [1]}, max_train={"sicke": 60}, workers=1)
    (job,) = seen
    assert job.n_outputs == 3 and job.metrics == ("accuracy",) and len(job.train_labels) == 54
    entry = summary["tasks"]["sicke"]
    assert entry["eval_examples"] == {"dev": 495, "test": 4906, "validation": 6} and entry["n_train"] == 54
    # three classes: the one trivial baseline is the training subsample's majority class, scored on each split
    assert {b["baseline"] for b in entry["trivial_baselines"]} == {"majority class"}
    majority = {(b["split"], b["metric"]): b["value"] for b in entry["trivial_baselines"]}
    assert majority[("test", "accuracy")] in (1404 / 4906, 2790 / 4906, 712 / 4906)
    assert entry["chosen"]["informative"] is True  # perfect predictions beat it
    with pytest.raises(ValueError, match="the pre-check runs the tasks"):
        run_precheck("tiny-bert", shared_data / "GLUE", out=tmp_path, tasks=["qqp"])
