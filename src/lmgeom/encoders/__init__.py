"""Encoder stage: sentences in, per-layer word vectors out (layer 0 = embedding output)."""

from lmgeom.encoders.hf import POOLINGS, EncodedSentence, HFEncoder
from lmgeom.encoders.registry import NAMED_MODELS, load_encoder
from lmgeom.encoders.tiny import TINY_MODELS, tiny_model

__all__ = ["NAMED_MODELS", "POOLINGS", "TINY_MODELS", "EncodedSentence", "HFEncoder", "load_encoder", "tiny_model"]
