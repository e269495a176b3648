"""Device and dtype selection shared by every stage that runs a model."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_device(device: str = "auto") -> torch.device:
    """`auto` picks CUDA when present, else CPU; asking for CUDA without it is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available; use --device cpu or auto")
    return resolved


def resolve_compute_dtype(device: torch.device, dtype: str | None) -> torch.dtype:
    """fp32 on CPU (half precision is slow and lossy there); fp16 on GPU unless told otherwise."""
    if dtype is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}")
    return DTYPES[dtype]
