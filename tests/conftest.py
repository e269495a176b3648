from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SHARED_DATA = Path(os.environ.get("LMGEOM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"public data folder {SHARED_DATA} not present (set LMGEOM_DATA)")
    return SHARED_DATA


@pytest.fixture
def single_torch_thread() -> Iterator[None]:
    """Tiny models and flows on shared cores: intra-op threads only add contention (10-100x slower seen)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The `RunResult` of `lmgeom run` of tiny-bert on Lee with `helpers.TINY_RUN`, made once per session
    for the tests that only read it (`.store.path` is the run directory; a test that changes a run
    works on a copy)."""
    from helpers import TINY_RUN
    from lmgeom.pipeline import run

    result = run("tiny-bert", "lee", out=tmp_path_factory.mktemp("tiny-run") / "tiny-bert-lee", **TINY_RUN)
    assert result.steps_run[-1] == "report"
    return result


@pytest.fixture(scope="session")
def tiny_cli_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`lmgeom run --model tiny-bert` with `helpers.TINY_RUN_ARGS` through the CLI (in process), in an
    80-column terminal, made once per session: the run directory and what the command printed."""
    from typer.testing import CliRunner

    from helpers import TINY_RUN_ARGS
    from lmgeom.cli.main import app

    out = tmp_path_factory.mktemp("tiny-cli-run") / "tiny-bert-lee"
    outcome = CliRunner().invoke(app, ["run", "--model", "tiny-bert", *TINY_RUN_ARGS, "--out", str(out)], env={"COLUMNS": "80"})
    assert outcome.exit_code == 0, outcome.output
    return out, outcome.output
