"""The fine-tuned model's pieces: the inputs tokenized once (`Tokenized`, padded per batch) and the
classifier (encoder -> pooled sentence vector -> optional calibration or IsoBN layer -> linear head).
`train.py` trains it; the I-STAR regulariser (`istar.py`) reads its encoder."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from lmgeom.errors import InputError

Inputs = Sequence[str] | Sequence[tuple[str, str]]


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    content_mask: torch.Tensor  # attention and not a special token


class Tokenized:
    """Token ids and special-token masks of every input, padded per batch."""

    def __init__(self, tokenizer: Any, inputs: Inputs, *, max_length: int, pad_id: int, name: str) -> None:
        if len(inputs) == 0:
            raise InputError(f"{name} is empty; give at least one input")
        pairs = [isinstance(item, (tuple, list)) for item in inputs]
        if any(pairs) and not all(pairs):
            raise InputError(f"{name} mixes single texts and (text, text) pairs; give one kind")
        self.ids: list[list[int]] = []
        self.special: list[list[int]] = []
        for index, item in enumerate(inputs):
            texts = tuple(item) if pairs[0] else (item,)
            if len(texts) != (2 if pairs[0] else 1) or not all(isinstance(text, str) for text in texts):
                raise InputError(f"{name}[{index}] must be a string or a (string, string) pair, got {item!r}")
            encoded = tokenizer(*texts, truncation=True, max_length=max_length, return_special_tokens_mask=True)
            if sum(1 - flag for flag in encoded["special_tokens_mask"]) == 0:
                raise InputError(f"{name}[{index}] ({item!r}) has no tokens besides special tokens; remove empty inputs")
            self.ids.append(list(encoded["input_ids"]))
            self.special.append(list(encoded["special_tokens_mask"]))
        self.pad_id = pad_id

    def __len__(self) -> int:
        return len(self.ids)

    def lengths(self) -> np.ndarray:
        return np.array([len(ids) for ids in self.ids], dtype=np.int64)

    def batch(self, rows: Sequence[int], device: torch.device) -> Batch:
        length = max(len(self.ids[row]) for row in rows)
        input_ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), length), dtype=torch.long)
        content = torch.zeros((len(rows), length), dtype=torch.bool)
        for position, row in enumerate(rows):
            size = len(self.ids[row])
            input_ids[position, :size] = torch.tensor(self.ids[row])
            attention[position, :size] = 1
            content[position, :size] = torch.tensor(self.special[row]) == 0
        return Batch(input_ids.to(device), attention.to(device), content.to(device))


def pool(hidden: torch.Tensor, content_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Sentence vectors from (batch, length, dim) states: mean of the content pieces, the last one,
    or the first position (`cls`: BERT's [CLS] token, special tokens included)."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "last":
        positions = torch.arange(content_mask.shape[1], device=content_mask.device)
        last = torch.where(content_mask, positions, -1).amax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    weights = content_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


class Classifier(nn.Module):
    """Encoder -> pooled vector -> optional layer (calibration or IsoBN) -> linear head."""

    def __init__(self, encoder: nn.Module, head: nn.Linear, layer: nn.Module | None, pooling: str) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.layer = layer
        self.pooling = pooling

    def forward(self, batch: Batch, *, hidden_states: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """(logits, pooled vector, vector the head reads, all hidden states or None)."""
        outputs = self.encoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                               output_hidden_states=hidden_states, use_cache=False)
        pooled = pool(outputs.last_hidden_state, batch.content_mask, self.pooling)
        features = pooled if self.layer is None else self.layer(pooled)
        return self.head(features), pooled, features, outputs.hidden_states if hidden_states else None
