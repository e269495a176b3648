"""What every encoder produces and what extraction needs from an encoder (no torch needed here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import numpy as np

from lmgeom.corpus.corpus import Sentence


@dataclass
class EncodedSentence:
    """Per-layer vectors of one sentence's stored tokens (words, and special tokens when kept)."""

    vectors: np.ndarray  # (layers, n_tokens, dim), float32: every layer of the model, or those asked for
    words: list[str]
    is_special: np.ndarray  # (n_tokens,) bool
    n_pieces: np.ndarray  # (n_tokens,) pieces pooled into each token
    n_windows: int
    n_unaligned: int = 0  # words left out because the tokenizer dropped all their characters
    n_truncated: int = 0  # words of more pieces than a window holds: pooled from the pieces of one window


class Encoder(Protocol):
    """A model that turns sentences into per-layer word vectors (layer 0 = its input layer).

    `settings()` is what a store records about how its vectors were made; it must include a
    `model_fingerprint` that changes whenever the weights, tokenizer or configuration do, since a
    resumed extraction is refused when the settings differ. An encoder whose layers are not an embedding
    output and transformer blocks may say what they are in a `layer_note` attribute (ELMo's: its
    character-CNN layer and biLSTM layers); the store and every result of it record that note, else
    `lmgeom.store.layout.LAYER_NOTE`."""

    model_id: str
    n_layers: int
    dim: int

    def settings(self) -> dict[str, Any]: ...

    def encode(self, sentences: Sequence[Sentence], *, first_index: int = 0,
               layers: Sequence[int] | None = None) -> list[EncodedSentence]:
        """Vectors of every layer, or of `layers` only (the model's numbering, ascending), in that order.
        Extraction passes `layers` only when it stores some of the layers, so an encoder that is never
        asked for some may leave the parameter out."""
        ...
