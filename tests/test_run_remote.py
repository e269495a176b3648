"""`lmgeom run --out URL`: the main job on any fsspec location (memory://, file://, s3://), interrupted
and resumed, with the results of a run in a local folder."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import fsspec
import pytest
from typer.testing import CliRunner

from lmgeom.cli.main import app
from lmgeom.progress import NoProgress
from lmgeom import rundir
from lmgeom.pipeline import run
from lmgeom.store.location import Location

from helpers import TINY_RUN, TINY_RUN_ARGS

OPTIONS = TINY_RUN  # the options of the session's tiny run, the local run the others must equal
STEPS = ["extract", "contextuality", "isotropy", "calibration", "static_embeddings", "similarity", "geometry", "report"]
# the result documents whose numbers a run elsewhere must reproduce
COMPARED = (rundir.CONTEXTUALITY, rundir.SUMMARY, rundir.ISOTROPY, rundir.CALIBRATION)


@pytest.fixture
def local_run(tiny_run: Any) -> Path:
    return Path(tiny_run.store.path)


def _numbers(value: Any) -> Any:
    """A result document's content without what names where and when it was made."""
    if isinstance(value, dict):
        return {key: _numbers(item) for key, item in value.items() if key not in ("seconds", "created")}
    if isinstance(value, list):
        return [_numbers(item) for item in value]
    return value


def _close(a: Any, b: Any, rtol: float, path: str = "") -> None:
    """a == b, floats within `rtol` (a store written in shards encodes other batches: float32 rounding)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), path
        for key in a:
            _close(a[key], b[key], rtol, f"{path}.{key}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, rtol, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rtol, abs_tol=rtol), (path, a, b)
    else:
        assert a == b, (path, a, b)


def assert_same_results(local: Path, remote: str, *, rtol: float) -> None:
    for spec in COMPARED:
        expected, got = rundir.read_json(spec.at(local), spec.kind), rundir.read_json(spec.at(remote), spec.kind)
        assert expected is not None and got is not None, spec.name
        _close(_numbers(expected["records" if "records" in expected else "layers"]),
               _numbers(got["records" if "records" in got else "layers"]), rtol, spec.name)
    for name in ("static/3.benchmarks.json", "explorer.json"):
        assert Location.of(rundir.target(remote, name)).exists(), name
    # every file of the local run is in the remote one (the store's own files differ: folder vs shards)
    results = {relative for relative in Location.of(local).files() if rundir.spec_of(relative) is not None
               or relative.startswith(("figures/", "calibrators/", "static/"))}
    assert results <= set(Location.of(remote).files()), results - set(Location.of(remote).files())
    page = Location.of(rundir.REPORT.at(remote)).read_bytes().decode()
    assert 'href="figures/anisotropy.png"' in page


class _StopAt(NoProgress):
    """Interrupts a run when `stage` starts, as a crash or a kill would."""

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        if stage == self.stage:
            raise KeyboardInterrupt(stage)


def test_run_on_memory_resumes_and_equals_the_local_run(local_run: Path):
    url = f"memory://lmgeom-tests/{uuid.uuid4().hex}/run"
    with pytest.raises(KeyboardInterrupt):
        run("tiny-bert", "lee", out=url, progress=_StopAt("isotropy"), **OPTIONS)
    record = rundir.read_json(rundir.RUN.at(url), "run")
    assert record is not None and sorted(record["steps"]) == ["contextuality", "extract"]
    assert record["device"] == "cpu" and record["steps"]["contextuality"]["device"] == "cpu"
    resumed = run("tiny-bert", "lee", out=url, **OPTIONS)
    assert resumed.steps_skipped == ["extract", "contextuality"]
    assert resumed.steps_run == ["isotropy", "calibration", "static_embeddings", "similarity", "geometry", "report"]
    assert all(isinstance(path, str) and path.startswith(url + "/") for path in resumed.paths)
    assert_same_results(local_run, url, rtol=1e-5)
    # what a result file records of where it ran
    assert rundir.read_json(rundir.ISOTROPY.at(url), "isotropy")["device"] == "cpu"
    assert rundir.read_json(rundir.CALIBRATION.at(url), "calibration")["device"] == "cpu"
    assert rundir.read_json(rundir.STATIC_BENCHMARKS.at(url, layer=3), rundir.STATIC_BENCHMARKS.kind)["device"] == "cpu"
    fsspec.filesystem("memory").rm(Location.of(url).root, recursive=True)


def test_run_on_a_file_url_through_the_cli_equals_the_local_run(local_run: Path, tmp_path: Path):
    folder = tmp_path / "by-url"
    outcome = CliRunner().invoke(app, ["run", "--model", "tiny-bert", *TINY_RUN_ARGS, "--out", f"file://{folder}"])
    assert outcome.exit_code == 0, outcome.output
    # a file:// URL is a local folder: the same store, the same numbers bit for bit
    assert_same_results(local_run, str(folder), rtol=0.0)
    assert json.loads((folder / "run.json").read_text())["device"] == "cpu"


# ---- s3:// on a local S3-compatible server (moto), through the CLI, across processes ---------------

def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def s3_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("bucket")
        yield env
    finally:
        server.terminate()
        server.wait(timeout=30)


def _lmgeom(*args: str) -> list[str]:
    """The `lmgeom` command in a fresh interpreter of this environment."""
    return [sys.executable, "-c", "from lmgeom.cli.main import app; app(prog_name='lmgeom')", *args]


@pytest.mark.processes
def test_run_on_s3_through_the_cli_is_killed_resumes_and_equals_the_local_run(local_run: Path, s3_server: dict[str, str]):
    url = "s3://bucket/run"
    command = _lmgeom("run", "--model", "tiny-bert", *TINY_RUN_ARGS, "--out", url)
    env = {**os.environ, **s3_server, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert first.stdout is not None
    lines = []
    for line in first.stdout:
        lines.append(line)
        if line.startswith("isotropy: started"):  # contextuality is recorded in run.json: kill the run here
            first.send_signal(signal.SIGKILL)
            break
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL, "".join(lines)
    fsspec.filesystem("s3").invalidate_cache()
    record = rundir.read_json(rundir.RUN.at(url), "run")
    assert record is not None and sorted(record["steps"]) == ["contextuality", "extract"]

    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "skipped (already done with these settings): extract, contextuality" in " ".join(second.stdout.split())
    fsspec.filesystem("s3").invalidate_cache()
    record = rundir.read_json(rundir.RUN.at(url), "run")
    assert record is not None and list(record["steps"]) == STEPS and record["device"] == "cpu"
    assert_same_results(local_run, url, rtol=1e-5)
