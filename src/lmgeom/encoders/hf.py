"""`HFEncoder`: every hidden layer of any Hugging Face `AutoModel`, pooled from pieces to words."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from lmgeom.corpus.corpus import Sentence
from lmgeom.encoders.alignment import TokenizedSentence, choose_windows, plan_windows, tokenize_sentence, tokenize_sentences
from lmgeom.encoders.base import EncodedSentence

POOLINGS = ("mean", "first", "last")
# Config entries that say where or how a model was loaded, not what it is (the compute dtype is
# recorded in the store's settings on its own).
_CONFIG_KEYS_NOT_FINGERPRINTED = ("transformers_version", "dtype", "torch_dtype")


def _short_hash(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def hash_state_dict(model: torch.nn.Module) -> str:
    """Hash of every tensor of the state dict (name, dtype, shape, bytes): exact, one pass over the weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def hash_tokenizer(tokenizer: Any) -> str:
    """Hash of the tokenizer's full definition (vocabulary, normalizer, pre-tokenizer,
    post-processor, added tokens) and the special tokens transformers assigns."""
    special = json.dumps(tokenizer.special_tokens_map, sort_keys=True, default=str)
    return _short_hash(tokenizer.backend_tokenizer.to_str(), special)


def hash_config(config: Any) -> str:
    """Hash of the model config, leaving out private entries and `_CONFIG_KEYS_NOT_FINGERPRINTED`."""
    entries = {key: value for key, value in config.to_dict().items() if not key.startswith("_") and key not in _CONFIG_KEYS_NOT_FINGERPRINTED}
    return _short_hash(json.dumps(entries, sort_keys=True, default=str))


@dataclass
class _Unit:
    """Positions of one window's input that pool into one output vector."""

    window: int
    positions: np.ndarray


class HFEncoder:
    """Encode sentences with a transformers model and return every layer (layer 0 = embedding output).

    The model reads each sentence's natural text with the tokenizer's default special tokens; pieces
    are pooled into the words their character spans overlap (`pooling`: mean, first or last piece).
    Inputs longer than `max_length` are split into overlapping windows, and each word takes its
    vector from the window where it has most context on both sides.
    `weights_fingerprint` identifies the weights cheaply (e.g. a hash of the weight files); None
    hashes every tensor of the state dict. The store records it with hashes of the tokenizer and
    the config as `model_fingerprint`, so a resumed extraction refuses another model.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        model_id: str,
        weights_fingerprint: str | None = None,
        pooling: str = "mean",
        keep_special: bool = False,
        prepend_bos: bool = False,
        skip_unaligned: bool = False,
        device: torch.device | str = "cpu",
        max_length: int | None = None,
        max_batch_tokens: int = 8192,
        max_batch_size: int = 64,
    ) -> None:
        if pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; choose one of {POOLINGS}")
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"{model_id}: lmgeom needs a fast tokenizer (character offsets); none could be loaded")
        if prepend_bos and tokenizer.bos_token_id is None:
            raise ValueError(f"{model_id}: --prepend-bos was asked for but the tokenizer defines no BOS token")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        weights = weights_fingerprint if weights_fingerprint is not None else hash_state_dict(model)
        # What a resumed extraction must share with the interrupted one: weights, tokenizer and config.
        self.model_fingerprint = f"weights:{weights} tokenizer:{hash_tokenizer(tokenizer)} config:{hash_config(model.config)}"
        self.pooling = pooling
        self.keep_special = keep_special
        self.prepend_bos = prepend_bos
        self.skip_unaligned = skip_unaligned
        self.device = torch.device(device)
        self.max_length = max_length or model_max_length(model, tokenizer)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        config: Any = model.config
        self.n_layers = int(config.num_hidden_layers) + 1
        self.dim = int(config.hidden_size)
        self.pad_id = next(
            (t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) if t is not None), 0
        )

    @property
    def compute_dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def settings(self) -> dict[str, Any]:
        """What a store records about how its vectors were made."""
        return {
            "model_id": self.model_id,
            "model_fingerprint": self.model_fingerprint,
            "model_class": type(self.model).__name__,
            "n_layers": self.n_layers,
            "dim": self.dim,
            "pooling": self.pooling,
            "special_tokens": "stored" if self.keep_special else "excluded",
            "prepend_bos": self.prepend_bos,
            "skip_unaligned": self.skip_unaligned,
            "max_length": self.max_length,
            "compute_dtype": str(self.compute_dtype).removeprefix("torch."),
        }

    # ---- public encoding API ------------------------------------------------------------------
    def encode(self, sentences: Sequence[Sentence], *, first_index: int = 0) -> list[EncodedSentence]:
        """Per-layer vectors for each sentence's words (plus special tokens when `keep_special`)."""
        windows: list[list[int]] = []
        units: list[_Unit] = []
        layout: list[tuple[int, int, list[str], np.ndarray, int, int]] = []
        tokenized_sentences = tokenize_sentences(
            self.tokenizer, sentences, prepend_bos=self.prepend_bos, first_index=first_index, skip_unaligned=self.skip_unaligned,
        )
        for sentence, tokenized in zip(sentences, tokenized_sentences):
            first_window, spans = self._append_windows(tokenized, windows)
            chosen = choose_windows(tokenized.word_pieces, spans)
            word_units = [
                _Unit(first_window + w, pieces - spans[w][0] + len(tokenized.prefix))
                for pieces, w in zip(tokenized.word_pieces, chosen)
            ]
            prefix_units, suffix_units = (
                self._special_units(tokenized, spans, first_window) if self.keep_special else ([], [])
            )
            sentence_units = prefix_units + word_units + suffix_units
            words = (
                self.tokenizer.convert_ids_to_tokens(tokenized.prefix if prefix_units else [])
                + [sentence.words[i].text for i in tokenized.kept_words]
                + self.tokenizer.convert_ids_to_tokens(tokenized.suffix if suffix_units else [])
            )
            is_special = np.zeros(len(sentence_units), dtype=bool)
            is_special[: len(prefix_units)] = True
            is_special[len(prefix_units) + len(word_units) :] = True
            n_unaligned = len(sentence.words) - len(tokenized.kept_words)
            layout.append((len(units), len(sentence_units), words, is_special, len(spans), n_unaligned))
            units.extend(sentence_units)
        pooled = self._pool_units(windows, units, self.pooling)
        return [
            EncodedSentence(
                vectors=pooled[:, start : start + count],
                words=words,
                is_special=is_special,
                n_pieces=np.array([len(u.positions) for u in units[start : start + count]], dtype=np.int16),
                n_windows=n_windows,
                n_unaligned=n_unaligned,
            )
            for start, count, words, is_special, n_windows, n_unaligned in layout
        ]

    def sentence_embeddings(
        self,
        texts: Sequence[str],
        *,
        include_special: bool = True,
        on_batch: Callable[[int], None] | None = None,
        batch_sentences: int = 256,
    ) -> np.ndarray:
        """Mean of a sentence's pieces per layer, (n_layers, n_texts, dim): the sentence-transformers
        convention when `include_special` (CLS/SEP or BOS among the pieces); long texts use windows."""
        out = np.empty((self.n_layers, len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_sentences):
            chunk = texts[start : start + batch_sentences]
            windows: list[list[int]] = []
            units: list[_Unit] = []
            owners: list[int] = []
            for offset, text in enumerate(chunk):
                tokenized = tokenize_sentence(
                    self.tokenizer, Sentence(text, ()), prepend_bos=self.prepend_bos, sentence_index=start + offset
                )
                first_window, spans = self._append_windows(tokenized, windows)
                pieces = [np.array([p]) for p in range(len(tokenized.content))]
                chosen = choose_windows(pieces, spans) if pieces else np.empty(0, dtype=np.int64)
                sentence_units = [
                    _Unit(first_window + w, p - spans[w][0] + len(tokenized.prefix)) for p, w in zip(pieces, chosen)
                ]
                if include_special or not sentence_units:
                    prefix_units, suffix_units = self._special_units(tokenized, spans, first_window)
                    sentence_units = prefix_units + sentence_units + suffix_units
                if not sentence_units:
                    raise ValueError(f"text {start + offset} ({text!r}) yields no tokenizer pieces")
                units.extend(sentence_units)
                owners.extend([offset] * len(sentence_units))
            pooled = self._pool_units(windows, units, "mean")
            owner_index = torch.as_tensor(owners)
            sums = torch.zeros(self.n_layers, len(chunk), self.dim, dtype=torch.float64)
            sums.index_add_(1, owner_index, torch.from_numpy(pooled).double())
            counts = torch.bincount(owner_index, minlength=len(chunk)).double()
            out[:, start : start + len(chunk)] = (sums / counts[None, :, None]).float().numpy()
            if on_batch is not None:
                on_batch(len(chunk))
        return out

    # ---- internals ----------------------------------------------------------------------------
    def _append_windows(self, tokenized: TokenizedSentence, windows: list[list[int]]) -> tuple[int, list[tuple[int, int]]]:
        """Append the sentence's model inputs (special tokens around each window of content pieces);
        return the index of its first window and the windows' content spans."""
        first_window = len(windows)
        spans = plan_windows(len(tokenized.content), self.max_length - len(tokenized.prefix) - len(tokenized.suffix))
        windows.extend(tokenized.prefix + tokenized.content[a:b] + tokenized.suffix for a, b in spans)
        return first_window, spans

    def _special_units(self, tokenized: TokenizedSentence, spans: list[tuple[int, int]], first_window: int) -> tuple[list[_Unit], list[_Unit]]:
        """Prefix specials from the first window, suffix specials from the last."""
        last_window = first_window + len(spans) - 1
        suffix_start = len(tokenized.prefix) + spans[-1][1] - spans[-1][0]
        prefix = [_Unit(first_window, np.array([i])) for i in range(len(tokenized.prefix))]
        suffix = [_Unit(last_window, np.array([suffix_start + i])) for i in range(len(tokenized.suffix))]
        return prefix, suffix

    @torch.inference_mode()
    def _pool_units(self, windows: list[list[int]], units: list[_Unit], pooling: str) -> np.ndarray:
        """Run the windows in length-sorted, dynamically padded batches and pool each unit's positions."""
        positions = [
            u.positions[:1] if pooling == "first" else u.positions[-1:] if pooling == "last" else u.positions for u in units
        ]
        counts = np.array([len(p) for p in positions], dtype=np.int64)
        piece_unit = np.repeat(np.arange(len(units)), counts)
        piece_window = np.repeat(np.array([u.window for u in units], dtype=np.int64), counts)
        piece_position = np.concatenate(positions) if positions else np.empty(0, dtype=np.int64)
        by_window = np.argsort(piece_window, kind="stable")
        window_bounds = np.searchsorted(piece_window[by_window], np.arange(len(windows) + 1))
        # A unit of one piece is that piece's vector: it is copied into place, and neither zeroed nor
        # divided (x / 1 == x); only units of several pieces are zeroed, summed into and divided.
        # On a wide model each of those passes over every layer of the chunk costs a few per cent.
        alone = counts == 1
        piece_alone = alone[piece_unit]
        shared_units = torch.as_tensor(np.flatnonzero(~alone), device=self.device)
        shape = (self.n_layers, len(units), self.dim)
        # On the CPU the chunk's vectors (hundreds of MB) come from numpy, which asks Linux for huge
        # pages for large arrays: writing them first then faults about half the CPU time of torch's memory.
        sums = (torch.from_numpy(np.empty(shape, dtype=np.float32)) if self.device.type == "cpu"
                else torch.empty(shape, dtype=torch.float32, device=self.device))
        sums.index_fill_(1, shared_units, 0.0)
        row_of_window = np.zeros(len(windows), dtype=np.int64)
        order = sorted(range(len(windows)), key=lambda w: (-len(windows[w]), w))
        for batch in self._batches(order, windows):
            length = len(windows[batch[0]])
            input_ids = torch.full((len(batch), length), self.pad_id, dtype=torch.long)
            attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
            for row, w in enumerate(batch):
                input_ids[row, : len(windows[w])] = torch.tensor(windows[w])
                attention_mask[row, : len(windows[w])] = 1
            hidden = self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                output_hidden_states=True,
                use_cache=False,
            ).hidden_states
            pieces = np.concatenate([by_window[window_bounds[w] : window_bounds[w + 1]] for w in batch])
            if pieces.size == 0:
                continue
            row_of_window[batch] = np.arange(len(batch))
            flat = row_of_window[piece_window[pieces]] * length + piece_position[pieces]
            is_alone = piece_alone[pieces]
            flat_alone, flat_shared = (torch.as_tensor(flat[m], device=self.device) for m in (is_alone, ~is_alone))
            slots_alone, slots_shared = (torch.as_tensor(piece_unit[pieces[m]], device=self.device) for m in (is_alone, ~is_alone))
            for layer, states in enumerate(hidden):
                rows = states.reshape(-1, self.dim)
                sums[layer].index_copy_(0, slots_alone, rows[flat_alone].float())
                if len(slots_shared):
                    sums[layer].index_add_(0, slots_shared, rows[flat_shared].float())
        if len(shared_units):
            divisors = torch.as_tensor(counts[~alone], dtype=torch.float32, device=self.device)[None, :, None]
            sums[:, shared_units] = sums[:, shared_units] / divisors
        return sums.cpu().numpy()

    def _batches(self, order: list[int], windows: list[list[int]]) -> Iterator[list[int]]:
        batch: list[int] = []
        for w in order:
            # order is longest first, so the first window of a batch sets its padded length
            if batch and ((len(batch) + 1) * len(windows[batch[0]]) > self.max_batch_tokens or len(batch) == self.max_batch_size):
                yield batch
                batch = []
            batch.append(w)
        if batch:
            yield batch


def model_max_length(model: torch.nn.Module, tokenizer: Any) -> int:
    """The longest input the model takes: its position limit, capped by the tokenizer's stated maximum."""
    config = model.config
    positions = [getattr(config, name, None) for name in ("max_position_embeddings", "n_positions")]
    limits = [int(x) for x in positions if isinstance(x, int) and x > 0]
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 1_000_000:
        limits.append(declared)
    return min(limits) if limits else 512
