"""Device and dtype selection shared by every stage that runs a model or analyses a store."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

from lmgeom.errors import InputError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` picks CUDA when present, else CPU; asking for CUDA without it is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):  # torch's own error for a malformed device string
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda", "mps"):
        raise InputError(f"unknown `device` {device!r}: use auto, cpu, cuda, cuda:N or mps", param="device")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise InputError("`device='cuda'` was asked for but no CUDA device is available; use `device='cpu'` or `device='auto'`",
                         param="device")
    count = torch.cuda.device_count() if resolved.type == "cuda" else 0
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= count:
        raise InputError(f"`device={device!r}` names a CUDA device this machine lacks (it has {count}: cuda:0"
                         f"{f' to cuda:{count - 1}' if count > 1 else ''}); use one of those, `cuda` or `auto`", param="device")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise InputError("`device='mps'` was asked for but no Apple GPU (MPS) is available; use `device='cpu'` or `device='auto'`",
                         param="device")
    return resolved


def device_name(device: torch.device | str) -> str:
    """A resolved device as results record it: "cpu", "mps", or "cuda:N" with its index."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def resolve_compute_dtype(device: torch.device, dtype: str | None) -> torch.dtype:
    """fp32 on CPU (half precision is slow and lossy there); fp16 on GPU unless told otherwise."""
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def resolve_analysis_device(device: str = "cpu") -> torch.device | None:
    """Where the analysis accumulators compute: None for numpy on the CPU (`cpu`, and `auto` without
    CUDA), a CUDA device for `cuda`/`cuda:N` (`auto` with CUDA), and torch on the CPU for
    `torch:cpu` (the GPU's code path, for tests and comparisons)."""
    if device == "torch:cpu":
        return torch.device("cpu")
    if not device.startswith(("cpu", "cuda", "auto")):
        raise InputError(f"unknown `device` {device!r} for the analysis; use cpu, cuda, cuda:N, auto or torch:cpu",
                         param="device")
    resolved = resolve_device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise InputError(f"the analysis runs on cpu or cuda, not {resolved.type}; use cpu, cuda, cuda:N, auto or torch:cpu")
    return None if resolved.type == "cpu" else resolved


@contextmanager
def ieee_float32() -> Iterator[None]:
    """cuDNN's float32 convolutions and recurrent layers computed in IEEE float32 inside the block,
    not in TensorFloat-32, which PyTorch lets cuDNN use by default on Ampere and newer GPUs (inputs
    rounded to a 10-bit mantissa: the ELMo biLM's states moved by up to 1e-3 against the CPU's).
    float32 matrix products are IEEE by PyTorch's default already. No effect on the CPU."""
    cudnn: Any = torch.backends.cudnn  # the fp32_precision settings are not in torch's type stubs
    if hasattr(cudnn, "conv") and hasattr(cudnn.conv, "fp32_precision"):  # the settings of torch >= 2.9
        settings: list[tuple[Any, str, object]] = [(cudnn.conv, "fp32_precision", "ieee"), (cudnn.rnn, "fp32_precision", "ieee")]
    else:
        settings = [(cudnn, "allow_tf32", False)]
    previous = [getattr(owner, name) for owner, name, _ in settings]
    for owner, name, value in settings:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for (owner, name, _), value in zip(settings, previous):
            setattr(owner, name, value)
