"""How a calibration layer is kept fitted during fine-tuning (`CalibrationOptions`): the frozen
calibrator, batch-moment re-fits, the jointly trained flow, the isotropy guard and the variance
penalty, on tiny-bert and on constructed vectors."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import lmgeom.finetune.train as train_module
from lmgeom.calibrate import make_calibrator
from lmgeom.errors import InputError
from lmgeom.finetune import CalibrationLayer, CalibrationOptions, FineTuneOptions, finetune
from lmgeom.finetune.calibration import guard_fires, layer_isoscore
from lmgeom.stages.experiments.finetuning import method_options

pytestmark = pytest.mark.usefixtures("single_torch_thread")

WORDS = ["cat", "dog", "bank", "river", "money", "stone", "tree", "house"]
TEXTS = [f"The {WORDS[i % 8]} near the {WORDS[(3 * i + 1) % 8]} was seen on day {i}." for i in range(24)]
LABELS = np.arange(24) % 3
SMALL_FLOW = {"n_steps": 1, "hidden_size": 8, "n_epochs": 2}


def quick(**changes: object) -> FineTuneOptions:
    settings: dict = dict(epochs=2, batch_size=8, learning_rate=1e-3, recalibrate_every=100, device="cpu",
                          warmup_fraction=0.0, length_grouped=False, refit_after_last=False)
    settings.update(changes)
    return FineTuneOptions(**settings)


class Spy(CalibrationLayer):
    """A CalibrationLayer that keeps itself and a copy of each fit's torch form."""

    made: list["Spy"] = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fits: list[dict[str, torch.Tensor]] = []
        Spy.made.append(self)

    def _install(self, calibrator) -> None:
        super()._install(calibrator)
        assert self.transform is not None
        self.fits.append(copy.deepcopy(self.transform.state_dict()))


@pytest.fixture
def spy(monkeypatch):
    Spy.made = []
    monkeypatch.setattr(train_module, "CalibrationLayer", Spy)
    return Spy


def run(method: str, options: FineTuneOptions, params: dict | None = None):
    return finetune("tiny-bert", train_inputs=TEXTS, train_labels=LABELS, eval_inputs={"dev": TEXTS[:6]}, n_outputs=3,
                    method=method, options=FineTuneOptions(**{**options.__dict__, "method_params": params or {}}))


def same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ---- 1. the calibrator's parameters get no gradient; its input does --------------------------


def test_the_flow_is_frozen_and_the_encoder_trains_through_it(spy):
    result = run("flow", quick(), SMALL_FLOW)
    (layer,) = spy.made
    assert len(layer.fits) == 1  # fitted before step 0 only
    assert same_state(layer.fits[0], layer.transform.state_dict())  # the flow's parameters did not move
    assert not any(p.requires_grad for p in layer.transform.parameters())
    before, after = result.sentence_vectors["before"]["dev"], result.sentence_vectors["after"]["dev"]
    assert not np.allclose(before, after, atol=1e-4)  # the encoder's did
    assert result.method_params["calibration"] == CalibrationOptions().to_dict()
    assert "frozen" in result.method_params["calibrator_gradient"]


# ---- 2. re-fits from running batch moments ----------------------------------------------------


@pytest.mark.parametrize("method", ["whitening", "abtt", "conceptor", "standardize"])
def test_a_batch_refit_is_the_closed_form_fit_of_the_batch(method):
    rng = np.random.default_rng(0)
    first = rng.normal(size=(200, 6)) * np.geomspace(0.3, 3, 6)
    batch = rng.normal(size=(32, 6)) * np.geomspace(3, 0.3, 6) + 2.0
    make = (lambda: make_calibrator(method).set_params(n_components=1)) if method == "abtt" else (lambda: make_calibrator(method))
    layer = CalibrationLayer(make, options=CalibrationOptions(refit_on="batch", batch_momentum=1.0))
    layer.refit(first)
    layer.update_moments(torch.tensor(batch))
    layer.refit_from_moments()
    expected = make().fit(batch).transform(batch)
    got = layer(torch.tensor(batch, dtype=torch.float32)).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-4)
    # The reference variance is the new fit's output variance on the batch.
    np.testing.assert_allclose(layer.reference_variance.numpy(), expected.var(axis=0), rtol=1e-4, atol=1e-6)


def test_running_moments_move_by_the_momentum():
    rng = np.random.default_rng(1)
    first, batch = rng.normal(size=(100, 3)), rng.normal(size=(10, 3)) * 2 + 5
    layer = CalibrationLayer(lambda: make_calibrator("whitening"), options=CalibrationOptions(refit_on="batch", batch_momentum=0.25))
    layer.refit(first)
    layer.update_moments(torch.tensor(batch))
    np.testing.assert_allclose(layer._mean, 0.75 * first.mean(axis=0) + 0.25 * batch.mean(axis=0))
    np.testing.assert_allclose(layer._covariance, 0.75 * np.cov(first.T, ddof=0) + 0.25 * np.cov(batch.T, ddof=0))
    assert layer._count == pytest.approx(0.75 * 100 + 0.25 * 10)


def test_batch_refits_during_finetuning(spy):
    result = run("whitening", quick(recalibrate_every=2, calibration={"refit_on": "batch", "check_every": 3}))
    (layer,) = spy.made
    assert result.layer_log["refit_steps"] == [0, 2, 4]  # 3 steps an epoch, 6 in all
    assert len(layer.fits) == 3 and not same_state(layer.fits[0], layer.fits[1])
    assert [check["step"] for check in result.layer_checks] == [3, 6]
    assert any("running moments of the training batches (momentum 0.05)" in note for note in result.notes)
    assert result.method_params["calibration"]["refit_on"] == "batch"


# ---- 3. the flow trained jointly ---------------------------------------------------------------


def test_the_joint_flows_likelihood_rises_on_a_fixed_batch():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(300, 6)) * np.geomspace(0.3, 3, 6)
    layer = CalibrationLayer(lambda: make_calibrator("flow").set_params(device="cpu", **SMALL_FLOW),
                             options=CalibrationOptions(flow_training="joint"))
    layer.refit(X)
    parameters = layer.joint_parameters()
    assert parameters and all(p.requires_grad for p in parameters)
    start = [p.detach().clone() for p in parameters]
    batch = torch.tensor(rng.normal(size=(32, 6)) * np.geomspace(3, 0.3, 6) + 1.0, dtype=torch.float32)  # drifted vectors
    optimizer = torch.optim.Adam(parameters, lr=1e-2)
    losses = []
    for _ in range(30):
        nll = layer.negative_log_likelihood(batch)
        losses.append(float(nll))
        optimizer.zero_grad()
        nll.backward()
        optimizer.step()
    assert losses[-1] < losses[0] - 0.1
    assert any(not torch.equal(a, b) for a, b in zip(start, parameters))
    # The likelihood's gradient reaches the input (flow_nll_into_encoder) unless it is detached.
    x = batch.clone().requires_grad_(True)
    layer.negative_log_likelihood(x).backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0


@pytest.mark.parametrize("into_encoder", [False, True])
def test_the_joint_flow_trains_during_finetuning(spy, into_encoder):
    result = run("flow", quick(recalibrate_every=2, calibration={"flow_training": "joint", "check_every": 3,
                                                                "flow_nll_into_encoder": into_encoder}), SMALL_FLOW)
    (layer,) = spy.made
    assert len(layer.fits) == 1 and result.layer_log["refit_steps"] == [0]  # no re-fit replaces it
    assert not same_state(layer.fits[0], layer.transform.state_dict())  # its parameters trained
    assert len(result.layer_log["nll_per_epoch"]) == 2 and np.isfinite(result.layer_log["nll_per_epoch"]).all()
    assert [check["step"] for check in result.layer_checks] == [3, 6]
    assert "trained" in result.method_params["calibrator_gradient"]
    assert result.method_params["calibration"]["flow_nll_into_encoder"] is into_encoder


# ---- 4. the isotropy guard and the variance penalty -------------------------------------------


def test_the_guard_fires_on_collapsing_vectors_only():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(400, 8)) * np.geomspace(0.1, 2, 8)
    layer = CalibrationLayer(lambda: make_calibrator("whitening"))
    layer.refit(X)
    reference = layer_isoscore(layer, X)
    fresh = rng.normal(size=(400, 8)) * np.geomspace(0.1, 2, 8)
    fires, now = guard_fires(layer, fresh, reference, 0.5)
    assert not fires and now > 0.5 * reference
    # The encoder drifts along the direction the fit saw least of: the whitening blows it up.
    collapsing = fresh + np.outer(rng.normal(size=400) * 20, np.eye(8)[0])
    fires, now = guard_fires(layer, collapsing, reference, 0.5)
    assert fires and now < 0.5 * reference


def test_the_guard_refits_during_finetuning(spy):
    # A threshold of 0.999: every drop of the IsoScore after a fit triggers a re-fit.
    result = run("whitening", quick(calibration={"guard_isoscore": 0.999, "guard_every": 2, "guard_inputs": 12}))
    (layer,) = spy.made
    guarded = [g["step"] for g in result.layer_log["guard_refits"]]
    assert guarded and result.layer_log["refit_steps"] == [0, *guarded]
    assert len(layer.fits) == 1 + len(guarded) and result.layer_log["guard_checks"] >= len(guarded)
    assert all(g["isoscore"] < 0.999 * g["reference"] for g in result.layer_log["guard_refits"])
    assert any(note.startswith("guard:") for note in result.notes)


def test_the_variance_penalty():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(500, 5)) * np.geomspace(0.2, 4, 5) + 3
    layer = CalibrationLayer(lambda: make_calibrator("whitening"))
    layer.refit(X)
    np.testing.assert_allclose(layer.reference_variance.numpy(), np.full(5, 499 / 500), atol=1e-5)  # whitened with ddof 1
    assert float(layer.variance_penalty(layer(torch.tensor(X, dtype=torch.float32)))) < 1e-8
    x = torch.tensor(X * np.array([1, 1, 1, 1, 10.0]), dtype=torch.float32, requires_grad=True)
    penalty = layer.variance_penalty(layer(x))
    assert float(penalty) == pytest.approx(np.log(100.0) ** 2 / 5, rel=0.05)  # one dimension's variance x 100
    penalty.backward()
    assert float(x.grad.abs().sum()) > 0  # it reaches the encoder


def test_the_variance_penalty_during_finetuning():
    result = run("whitening", quick(calibration={"variance_penalty": 0.5}))
    assert len(result.layer_log["penalty_per_epoch"]) == 2 and all(v > 0 for v in result.layer_log["penalty_per_epoch"])


# ---- the options: checked, named, recorded ------------------------------------------------------


@pytest.mark.parametrize(("changes", "param"), [
    ({"refit_on": "window"}, "refit_on"), ({"batch_momentum": 0.0}, "batch_momentum"),
    ({"flow_training": "both"}, "flow_training"), ({"flow_nll_weight": -1.0}, "flow_nll_weight"),
    ({"flow_learning_rate": 0.0}, "flow_learning_rate"), ({"guard_isoscore": 1.5}, "guard_isoscore"),
    ({"guard_every": 0}, "guard_every"), ({"guard_inputs": 1}, "guard_inputs"),
    ({"variance_penalty": -0.1}, "variance_penalty"), ({"check_every": 0}, "check_every"),
    ({"flow_nll_into_encoder": "yes"}, "flow_nll_into_encoder")])
def test_bad_options_are_named(changes, param):
    with pytest.raises(InputError, match=param) as error:
        CalibrationOptions(**changes)
    assert error.value.params == (param,)


def test_options_that_do_not_apply_are_refused():
    with pytest.raises(InputError, match="unknown_name") as error:
        CalibrationOptions.from_dict({"unknown_name": 1})
    assert error.value.params == ("unknown_name",)
    for method, calibration, param in [("flow", {"refit_on": "batch"}, "refit_on"), ("cie", {"refit_on": "batch"}, "refit_on"),
                                       ("whitening", {"flow_training": "joint"}, "flow_training"),
                                       ("flow", {"flow_training": "joint", "guard_isoscore": 0.5}, "guard_isoscore"),
                                       ("none", {"variance_penalty": 1.0}, "calibration"),
                                       ("isobn", {"refit_on": "batch"}, "calibration")]:
        with pytest.raises(InputError) as error:
            run(method, quick(calibration=calibration))
        assert param in error.value.params, (method, calibration)


def test_options_parse_and_record():
    options = CalibrationOptions.parse("refit_on=batch, batch_momentum=0.1,guard_isoscore=none,flow_nll_into_encoder=true")
    assert options == CalibrationOptions(refit_on="batch", batch_momentum=0.1, flow_nll_into_encoder=True)
    assert options.changed() == {"refit_on": "batch", "batch_momentum": 0.1, "flow_nll_into_encoder": True}
    with pytest.raises(InputError, match="name=value"):
        CalibrationOptions.parse("refit_on")
    assert FineTuneOptions(calibration={"refit_on": "batch"}).calibration == CalibrationOptions(refit_on="batch")
    # A cell's options: a method without a calibration layer has the layer's options at their defaults
    # (the same cell whatever the calibrators ran with); a calibrator's hold only what differs from the defaults.
    given = {"epochs": 3, "recalibrate_every": 10, "refit_after_last": False, "calibration": {"refit_on": "batch", "guard_every": 10}}
    assert method_options("none", given) == {"epochs": 3, "recalibrate_every": 100, "refit_after_last": True}
    assert method_options("whitening", given) == {"epochs": 3, "recalibrate_every": 10, "refit_after_last": False,
                                                  "calibration": {"refit_on": "batch"}}
    assert method_options("whitening", {"epochs": 3}) == {"epochs": 3}
