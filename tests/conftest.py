from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
