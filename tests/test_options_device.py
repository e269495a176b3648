"""Options objects of the calibration stage, and `lmgeom run --device` reaching every step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.errors import InputError
from lmgeom.pipeline import job
from lmgeom.stages.calibration import CalibrationOptions
from lmgeom.engine import AnalysisOptions
from lmgeom.engine.options import StepOptions
from lmgeom.stages.similarity import SimilarityOptions


def test_calibration_options_round_trip_their_settings_and_refuse_bad_values():
    options = CalibrationOptions(methods=["whitening", "abtt"], layers=[3, 1], eval_rows=500, seed=4, device="cuda:1")
    assert options.methods == ("whitening", "abtt") and options.layers == (3, 1)
    settings = options.to_settings()
    assert settings == {"methods": ["whitening", "abtt"], "layers": [3, 1], "include_punct": False, "include_special": False,
                        "eval_rows": 500, "fit_rows": CalibrationOptions().fit_rows, "seed": 4}
    assert "device" not in settings  # where it ran changes no number: recorded beside the settings
    again = CalibrationOptions.from_settings(json.loads(json.dumps(settings)), device="cuda:1")
    assert again == options and hash(again) == hash(options)
    with pytest.raises(InputError, match="unknown calibration method") as error:
        CalibrationOptions(methods=("pca",))
    assert error.value.params == ("methods",)
    with pytest.raises(InputError, match="`eval_rows` must be at least 2"):
        CalibrationOptions(eval_rows=1)


def test_run_device_cpu_reaches_every_step_while_cuda_is_reported_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """With CUDA reported present, `auto` anywhere would pick the GPU (and fail: there is none here);
    `--device cpu` is resolved once and every step is given it."""
    import lmgeom.device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert lmgeom.device.resolve_analysis_device("auto") == torch.device("cuda")  # what a step left on auto would use
    asked: list[str] = []
    for name in ("resolve_device", "resolve_analysis_device"):
        original = getattr(lmgeom.device, name)

        def spy(device: str = "auto", _original: Callable[..., Any] = original) -> Any:
            asked.append(device)
            return _original(device)

        monkeypatch.setattr(lmgeom.device, name, spy)
    given: dict[str, Any] = {}
    for step in ("extract_model", "analyze_store", "measure_isotropy", "calibrate_store", "export_static_embeddings",
                 "similarity_matrix", "measure_geometry"):
        original = getattr(job, step)

        def record(*args: Any, _original: Callable[..., Any] = original, _step: str = step, **kwargs: Any) -> Any:
            options = next((arg for arg in args if isinstance(arg, (AnalysisOptions, CalibrationOptions, SimilarityOptions,
                                                                      StepOptions))), None)
            if isinstance(options, StepOptions):  # a step over the analysis's rows: its device is the analysis's
                options = options.analysis
            given.setdefault(_step, []).append(options.device if options is not None else kwargs.get("device"))
            return _original(*args, **kwargs)

        monkeypatch.setattr(job, step, record)

    out = tmp_path / "run"
    outcome = CliRunner().invoke(app, ["run", "--model", "tiny-bert", "--limit", "30", "--device", "cpu",
                                       "--num-workers", "1", "--out", str(out)])
    assert outcome.exit_code == 0, outcome.output
    assert "every step computed on cpu" in " ".join(outcome.output.split())
    assert given == {"extract_model": ["cpu"], "analyze_store": ["cpu"], "measure_isotropy": ["cpu"],
                     "calibrate_store": ["cpu"], "export_static_embeddings": ["cpu"] * 3, "similarity_matrix": ["cpu"],
                     "measure_geometry": ["cpu"]}
    assert "auto" not in asked and "cpu" in asked
    record = json.loads((out / "run.json").read_text())
    assert record["device"] == "cpu" and {step["device"] for step in record["steps"].values()} == {"cpu"}
    for name in ("isotropy.json", "calibration.json", "static/1.benchmarks.json", "geometry.json"):
        assert json.loads((out / name).read_text())["device"] == "cpu", name
    assert json.loads((out / "contextuality.json").read_text())["plan"]["device"] == "cpu"
    assert (out / "report.html").exists()


def test_ieee_float32_sets_cudnn_to_ieee_inside_the_block_and_restores_it():
    from lmgeom.device import ieee_float32

    cudnn = torch.backends.cudnn
    before = (cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision)
    with pytest.raises(RuntimeError, match="inside"):
        with ieee_float32():
            assert (cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision) == ("ieee", "ieee")
            raise RuntimeError("inside")
    assert (cudnn.conv.fp32_precision, cudnn.rnn.fp32_precision) == before
