"""Encoder stage: sentences in, per-layer word vectors out (layer 0 = embedding output).

The names that need torch and transformers (`HFEncoder`, `load_encoder`, the tiny models) are
imported on first use, so the store and the analyses can use `EncodedSentence` without them.
"""

from __future__ import annotations

from typing import Any

from lmgeom import _lazy as lazy
from lmgeom.encoders.base import EncodedSentence, Encoder
from lmgeom.encoders.options import POOLINGS, EncoderOptions

_LAZY = {
    "HFEncoder": "lmgeom.encoders.hf",
    "NAMED_MODELS": "lmgeom.encoders.named",
    "load_encoder": "lmgeom.encoders.registry",
    "TINY_MODELS": "lmgeom.encoders.tiny",
    "tiny_model": "lmgeom.encoders.tiny",
}

__all__ = ["EncodedSentence", "Encoder", "EncoderOptions", "POOLINGS", *_LAZY]


def __getattr__(name: str) -> Any:
    return lazy.load(__name__, _LAZY, name)
