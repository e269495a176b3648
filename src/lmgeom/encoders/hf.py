"""`HFEncoder`: every hidden layer of any Hugging Face `AutoModel`, pooled from pieces to words."""

from __future__ import annotations

import hashlib
import json
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch

from lmgeom.errors import InputError
from lmgeom.corpus.corpus import Sentence
from lmgeom.corpus.segment import Word
from lmgeom.encoders.alignment import ChunkWindows, TokenizedChunk, chunk_windows, concat_ranges, tokenize_chunk, unit_windows
from lmgeom.encoders.base import EncodedSentence
from lmgeom.encoders.options import POOLINGS, EncoderOptions
from lmgeom.encoders.sites import Capture, SiteCapture, resolve_sites, site_settings
from lmgeom.sitespec import DEFAULT_SITE

__all__ = ["POOLINGS", "EncoderOptions", "HFEncoder"]
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


@dataclass(frozen=True)
class _Units:
    """What a chunk's output vectors pool, in output order: unit u reads window[u] at
    positions[sum(counts[:u]):sum(counts[:u + 1])] (ascending); sentence s owns units bounds[s]:bounds[s + 1]."""

    window: np.ndarray
    counts: np.ndarray
    positions: np.ndarray
    bounds: np.ndarray


class _Lease:
    """A chunk's vectors lent from a buffer that the encoder reuses. The array made from this object
    (`np.asarray`) and every view of it keep the lease alive, so the lease dies exactly when the
    last of them does; its finalizer then hands the buffer back for a later chunk."""

    def __init__(self, buffer: np.ndarray, shape: tuple[int, ...], spare: deque[np.ndarray]) -> None:
        self.buffer = buffer
        self.__array_interface__ = {"shape": shape, "typestr": buffer.dtype.str, "data": (buffer.ctypes.data, False),
                                    "version": 3}
        weakref.finalize(self, _give_back, spare, buffer).atexit = False


def _give_back(spare: deque[np.ndarray], buffer: np.ndarray) -> None:
    # one spare buffer is enough: while one chunk is committed the next is pooled into the other
    if not spare:
        spare.append(buffer)


class HFEncoder:
    """Encode sentences with a transformers model and return every layer (layer 0 = embedding output).

    `options` (`EncoderOptions`, or its fields as keywords) say how: the model reads each sentence's
    natural text with the tokenizer's default special tokens; pieces are pooled into the words their
    character spans overlap (`pooling`: mean, first or last piece), or with `pooling="none"` every
    piece is a word of its own, named by the piece (`piece_sentences`). Inputs longer than `max_length`
    are split into overlapping windows, and each word takes its vector from the window where it has
    most context on both sides. The model runs where it is (its parameters' device); `options.device`
    and `compute_dtype` are for `load_encoder`, which puts it there.
    `weights_fingerprint` identifies the weights cheaply (e.g. a hash of the weight files); None
    hashes every tensor of the state dict. The store records it with hashes of the tokenizer and
    the config as `model_fingerprint`, so a resumed extraction refuses another model.
    `before_final_norm` stores the last layer before the model's final norm (its input, caught by a
    hook) where Hugging Face returns it after; `last_layer` says which tensor the last layer is.
    """

    random_init_seed: int | None = None
    """The seed of the `random-init` control when the weights are seeded random ones
    (`lmgeom.encoders.registry.load_encoder(..., random_init=seed)`), else None: the loaded weights."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        model_id: str,
        weights_fingerprint: str | None = None,
        options: EncoderOptions | None = None,
        **keywords: Any,
    ) -> None:
        options = EncoderOptions.of(options, **keywords)
        prepend_bos, max_length = options.prepend_bos, options.max_length
        if not getattr(tokenizer, "is_fast", False):
            raise InputError(f"{model_id}: lmgeom needs a fast tokenizer (character offsets); none could be loaded")
        if prepend_bos and tokenizer.bos_token_id is None:
            raise InputError(f"{model_id}: `prepend_bos=True` was asked for but the tokenizer defines no BOS token",
                             param="prepend_bos")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.model_id = model_id
        weights = weights_fingerprint if weights_fingerprint is not None else hash_state_dict(model)
        # What a resumed extraction must share with the interrupted one: weights, tokenizer and config.
        self.model_fingerprint = f"weights:{weights} tokenizer:{hash_tokenizer(tokenizer)} config:{hash_config(model.config)}"
        self.pooling = options.pooling
        self.keep_special = options.keep_special
        self.prepend_bos = prepend_bos
        self.skip_unaligned = options.skip_unaligned
        self.device = next(model.parameters()).device
        limit = model_max_length(model, tokenizer)
        if max_length is not None and not 2 <= max_length <= limit:
            raise InputError(f"`max_length` {max_length} is outside 2..{limit}: this model takes at most {limit} "
                             f"pieces; give a window length within that (longer sentences are split into windows)",
                             param="max_length")
        self.max_length = max_length or limit
        self.max_batch_tokens = options.max_batch_tokens
        self.max_batch_size = options.max_batch_size
        config: Any = model.config
        self.n_layers = int(config.num_hidden_layers) + 1
        self.dim = int(config.hidden_size)
        self.pad_id = next(
            (t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) if t is not None), 0
        )
        self._spare: deque[np.ndarray] = deque()  # memory of a chunk's vectors that nothing refers to any more
        self.last_layer = describe_last_layer(model, tokenizer, self.device)
        self._final_norm: torch.nn.Module | None = None
        self._norm_input: list[torch.Tensor] = []  # the final norm's input in the last forward pass (--before-final-norm)
        if options.before_final_norm:
            if self.last_layer["position"] != "after final norm":
                raise InputError(f"{model_id}: `before_final_norm` applies to models whose last hidden state is after "
                                 f"their final norm, but here: {self.last_layer['why']}; leave it out")
            found = final_norm(model)
            assert found is not None  # the last layer was found after it
            name, self._final_norm = found
            self._final_norm.register_forward_pre_hook(self._catch_norm_input)
            blocks = self.n_layers - 1
            self.last_layer = {"position": "before final norm", "final_norm": name,
                               "why": f"stored before the final norm on request (--before-final-norm): layer {blocks} is "
                                      f"block {blocks}'s output, the input of `{name}`, where Hugging Face returns the "
                                      "norm's output"}
        # the options as they resolved: what the store records and `EncoderOptions.from_settings` rebuilds
        self.options = replace(options, max_length=self.max_length, compute_dtype=str(self.compute_dtype).removeprefix("torch."))

    def _catch_norm_input(self, _module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        self._norm_input[:] = [inputs[0]]

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
            **self.options.to_settings(),
            "last_layer": self.last_layer,
        }

    def site_captures(self, sites: Sequence[str], layers: Sequence[int] | None = None) -> list[SiteCapture]:
        """The capture sites (`lmgeom.sitespec.parse_sites`' output) resolved on this model, each with
        the layers it fills among `layers` (None: every layer); see `lmgeom.encoders.sites.resolve_sites`."""
        return resolve_sites(self.model, sites, range(self.n_layers) if layers is None else layers)

    def site_settings(self, sites: Sequence[str], layers: Sequence[int] | None = None) -> dict[str, Any]:
        """What a store of these sites and layers records about them (`lmgeom.encoders.sites.site_settings`):
        each site's folder, layers, module, and the family's sum rule.

        Parameters
        ----------
        sites : sequence of str
            The sites, `resid_post` first (`lmgeom.sitespec.parse_sites`).
        layers : sequence of int or None, default None
            The stored layers (None: every layer).

        Returns
        -------
        dict
            The settings entries `sites`, `site_family`, `site_rule` and `site_last_layer`.
        """
        return site_settings(self.model, self.site_captures(sites, layers), self.last_layer)

    # ---- public encoding API ------------------------------------------------------------------
    def encode(self, sentences: Sequence[Sentence], *, first_index: int = 0,
               layers: Sequence[int] | None = None, sites: Sequence[str] | None = None) -> list[EncodedSentence]:
        """Per-layer vectors for each sentence's words (plus special tokens when `keep_special`): of
        every layer, or of `layers` only (the model's numbering, ascending), in that order. With `sites`
        (`lmgeom.sitespec.parse_sites`' output), the vectors are those of each site's layers
        (`site_captures`), site after site in the order given."""
        if self.pooling == "none":
            sentences = self.piece_sentences(sentences)
        chunk = tokenize_chunk(
            self.tokenizer, sentences, prepend_bos=self.prepend_bos, first_index=first_index, skip_unaligned=self.skip_unaligned,
        )
        windows = chunk_windows(chunk, self.max_length)
        word_sentence = np.repeat(np.arange(len(sentences)), np.diff(chunk.word_bounds))
        units = self._units(chunk, windows, word_sentence, chunk.piece_bounds, chunk.pieces,
                            specials=np.full(len(sentences), self.keep_special))
        pooled = self._pool(windows, units, "first" if self.pooling == "none" else self.pooling, layers, sites)
        n_pieces = units.counts.astype(np.int16)
        word_pieces = np.diff(chunk.piece_bounds)  # a word's pieces; more than it pooled when longer than a window
        encoded = []
        for index, sentence in enumerate(sentences):
            start, stop = int(units.bounds[index]), int(units.bounds[index + 1])
            kept = chunk.kept_words[chunk.word_bounds[index] : chunk.word_bounds[index + 1]]
            words = ([word.text for word in sentence.words] if len(kept) == len(sentence.words)
                     else [sentence.words[i].text for i in kept])
            n_prefix = 0
            if self.keep_special:
                ids = chunk.ids[chunk.bounds[index] : chunk.bounds[index + 1]]
                n_prefix, n_suffix = int(chunk.n_prefix[index]), int(chunk.n_suffix[index])
                words = (self.tokenizer.convert_ids_to_tokens(ids[:n_prefix].tolist()) + words
                         + self.tokenizer.convert_ids_to_tokens(ids[len(ids) - n_suffix :].tolist()))
            is_special = np.ones(stop - start, dtype=bool)
            is_special[n_prefix : n_prefix + len(kept)] = False
            pooled_pieces = units.counts[start + n_prefix : start + n_prefix + len(kept)]
            n_truncated = int((pooled_pieces < word_pieces[chunk.word_bounds[index] : chunk.word_bounds[index + 1]]).sum())
            encoded.append(EncodedSentence(
                vectors=pooled[:, start:stop],
                words=words,
                is_special=is_special,
                n_pieces=n_pieces[start:stop],
                n_windows=int(windows.first[index + 1] - windows.first[index]),
                n_unaligned=len(sentence.words) - len(kept),
                n_truncated=n_truncated,
            ))
        return encoded

    def piece_sentences(self, sentences: Sequence[Sentence]) -> list[Sentence]:
        """Each sentence with the tokenizer's pieces of its text as its words (`pooling="none"`): a
        piece's text is the piece (`##ate`, `[UNK]`), its span the characters the tokenizer maps it
        to; pieces of no character (none in WordPiece) are left out."""
        encoding = self.tokenizer([sentence.text for sentence in sentences], add_special_tokens=False,
                                  return_offsets_mapping=True)
        pieced = []
        for sentence, ids, offsets in zip(sentences, encoding["input_ids"], encoding["offset_mapping"]):
            pieces = self.tokenizer.convert_ids_to_tokens(ids)
            pieced.append(Sentence(sentence.text, tuple(Word(piece, int(start), int(end))
                                                        for piece, (start, end) in zip(pieces, offsets) if end > start)))
        return pieced

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
            batch = texts[start : start + batch_sentences]
            chunk = tokenize_chunk(self.tokenizer, [Sentence(text, ()) for text in batch], prepend_bos=self.prepend_bos,
                                   first_index=start)
            windows = chunk_windows(chunk, self.max_length)
            # every content piece is a unit of its own; the special tokens too where asked, or where there is nothing else
            n_content = chunk.n_content
            units = self._units(chunk, windows, np.repeat(np.arange(len(batch)), n_content), np.arange(int(n_content.sum()) + 1),
                                concat_ranges(np.zeros(len(batch), dtype=np.int64), n_content),
                                specials=np.full(len(batch), include_special) | (n_content == 0))
            sizes = np.diff(units.bounds)
            if not sizes.all():
                empty = int(np.flatnonzero(sizes == 0)[0])
                raise InputError(f"text {start + empty} ({batch[empty]!r}) yields no tokenizer pieces")
            pooled = self._pool(windows, units, "mean")
            owner_index = torch.as_tensor(np.repeat(np.arange(len(batch)), sizes))
            sums = torch.zeros(self.n_layers, len(batch), self.dim, dtype=torch.float64)
            sums.index_add_(1, owner_index, torch.from_numpy(pooled).double())
            counts = torch.as_tensor(sizes, dtype=torch.float64)
            out[:, start : start + len(batch)] = (sums / counts[None, :, None]).float().numpy()
            if on_batch is not None:
                on_batch(len(batch))
        return out

    # ---- internals ----------------------------------------------------------------------------
    def _units(self, chunk: TokenizedChunk, windows: ChunkWindows, unit_sentence: np.ndarray, piece_bounds: np.ndarray,
               pieces: np.ndarray, *, specials: np.ndarray) -> _Units:
        """The chunk's units in output order: for each sentence its prefix special tokens (where
        `specials`), its content units (unit u: content pieces pieces[piece_bounds[u]:piece_bounds[u + 1]]
        of sentence unit_sentence[u], ascending in u), its suffix special tokens. Prefix special
        tokens are read from a sentence's first window, suffix ones from its last."""
        n_sentences = len(specials)
        counts = np.diff(piece_bounds)
        window = unit_windows(windows, unit_sentence, piece_bounds, pieces)
        inside = (pieces >= np.repeat(windows.start[window], counts)) & (pieces < np.repeat(windows.stop[window], counts))
        if not inside.all():  # words longer than a window: the pieces of their window only
            counts = np.bincount(np.repeat(np.arange(len(counts)), counts)[inside], minlength=len(counts))
            pieces = pieces[inside]
        positions = pieces + np.repeat(chunk.n_prefix[unit_sentence] - windows.start[window], counts)
        if not specials.any():
            return _Units(window, counts, positions, np.searchsorted(unit_sentence, np.arange(n_sentences + 1)))
        n_prefix, n_suffix = (np.where(specials, n, 0) for n in (chunk.n_prefix, chunk.n_suffix))
        prefix_sentence, suffix_sentence = (np.repeat(np.arange(n_sentences), n) for n in (n_prefix, n_suffix))
        last_window = windows.first[1:] - 1
        prefix_positions = concat_ranges(np.zeros(n_sentences, dtype=np.int64), n_prefix)
        suffix_positions = concat_ranges(windows.lengths[last_window] - chunk.n_suffix, n_suffix)
        sentence = np.concatenate([prefix_sentence, unit_sentence, suffix_sentence])
        part = np.repeat([0, 1, 2], [len(prefix_sentence), len(unit_sentence), len(suffix_sentence)])
        order = np.lexsort((np.arange(len(sentence)), part, sentence))
        all_counts = np.concatenate([np.ones(len(prefix_sentence), dtype=np.int64), counts,
                                     np.ones(len(suffix_sentence), dtype=np.int64)])
        all_positions = np.concatenate([prefix_positions, positions, suffix_positions])
        offsets = np.cumsum(all_counts) - all_counts
        return _Units(
            window=np.concatenate([windows.first[prefix_sentence], window, last_window[suffix_sentence]])[order],
            counts=all_counts[order],
            positions=all_positions[concat_ranges(offsets[order], all_counts[order])],
            bounds=np.searchsorted(sentence[order], np.arange(n_sentences + 1)),
        )

    @torch.inference_mode()
    def _pool(self, windows: ChunkWindows, units: _Units, pooling: str, layers: Sequence[int] | None = None,
              sites: Sequence[str] | None = None) -> np.ndarray:
        """Run the windows in length-sorted, dynamically padded batches and pool each unit's positions,
        of every layer or of `layers` only, or of each of `sites`' layers (site after site): (number of
        layers, units, dim)."""
        chosen = list(range(self.n_layers)) if layers is None else [int(layer) for layer in layers]
        captures = self.site_captures(sites, chosen) if sites is not None else []
        targets = ([(capture.site, layer) for capture in captures for layer in capture.layers] if captures
                   else [(DEFAULT_SITE, layer) for layer in chosen])
        if pooling == "mean":
            counts, positions = units.counts, units.positions
        else:
            ends = np.cumsum(units.counts)
            counts = np.ones(len(units.counts), dtype=np.int64)
            positions = units.positions[ends - units.counts if pooling == "first" else ends - 1]
        piece_unit = np.repeat(np.arange(len(counts)), counts)
        piece_window = units.window[piece_unit]
        lengths = windows.lengths
        batches = self._batches(lengths)
        batch_of_window, row_of_window = np.empty((2, len(lengths)), dtype=np.int64)
        for index, batch in enumerate(batches):
            batch_of_window[batch], row_of_window[batch] = index, np.arange(len(batch))
        # every piece's row in its batch's flattened hidden states; pieces grouped by batch, and in a
        # batch those of units of one piece first, each group in unit order (so a unit's pieces are
        # summed in the order of their positions)
        piece_batch = batch_of_window[piece_window]
        batch_length = lengths[[batch[0] for batch in batches]]
        flat = row_of_window[piece_window] * batch_length[piece_batch] + positions
        alone = counts == 1
        piece_alone = alone[piece_unit]
        by_batch = np.lexsort((np.arange(len(flat)), ~piece_alone, piece_batch))
        bounds = np.searchsorted(piece_batch[by_batch] * 2 + ~piece_alone[by_batch], np.arange(2 * len(batches) + 1))
        flat_rows = torch.as_tensor(flat[by_batch], device=self.device)
        slots = torch.as_tensor(piece_unit[by_batch], device=self.device)
        # A unit of one piece is that piece's vector: it is copied into place, and neither zeroed nor
        # divided (x / 1 == x); only units of several pieces are zeroed, summed into and divided.
        # On a wide model each of those passes over every layer of the chunk costs a few per cent.
        shared_units = torch.as_tensor(np.flatnonzero(~alone), device=self.device)
        shape = (len(targets), len(counts), self.dim)
        pooled = self._output(shape)
        sums = (torch.from_numpy(pooled) if self.device.type == "cpu"
                else torch.empty(shape, dtype=torch.float32, device=self.device))
        sums.index_fill_(1, shared_units, 0.0)
        column = np.arange(len(windows.ids)) - np.repeat(windows.bounds[:-1], lengths)
        with Capture(self.model, captures) as capture:
            for index, batch in enumerate(batches):
                length = int(batch_length[index])
                tokens = concat_ranges(windows.bounds[batch], lengths[batch])
                rows, columns = np.repeat(np.arange(len(batch)), lengths[batch]), column[tokens]
                input_ids = np.full((len(batch), length), self.pad_id, dtype=np.int64)
                attention_mask = np.zeros((len(batch), length), dtype=np.int64)
                input_ids[rows, columns], attention_mask[rows, columns] = windows.ids[tokens], 1
                hidden = self.model(
                    input_ids=torch.from_numpy(input_ids).to(self.device),
                    attention_mask=torch.from_numpy(attention_mask).to(self.device),
                    output_hidden_states=True,
                    use_cache=False,
                ).hidden_states
                if self._final_norm is not None:  # --before-final-norm: the norm's input, caught by its hook
                    hidden = (*hidden[:-1], self._norm_input.pop())
                caught = capture.pop((len(batch), length, self.dim))
                first, middle, last = bounds[2 * index : 2 * index + 3]
                if first == last:
                    continue
                flat_alone, flat_shared = flat_rows[first:middle], flat_rows[middle:last]
                slots_alone, slots_shared = slots[first:middle], slots[middle:last]
                for target, (site, layer) in enumerate(targets):
                    layer_rows = (hidden[layer] if site == DEFAULT_SITE else caught[site, layer]).reshape(-1, self.dim)
                    sums[target].index_copy_(0, slots_alone, layer_rows[flat_alone].float())
                    if middle < last:
                        sums[target].index_add_(0, slots_shared, layer_rows[flat_shared].float())
        if len(shared_units):
            divisors = torch.as_tensor(counts[~alone], dtype=torch.float32, device=self.device)[None, :, None]
            sums[:, shared_units] = sums[:, shared_units] / divisors
        if self.device.type != "cpu":
            torch.from_numpy(pooled).copy_(sums)
        return pooled

    def _output(self, shape: tuple[int, int, int]) -> np.ndarray:
        """A float32 array for a chunk's vectors: in the memory of an earlier chunk's vectors once
        nothing refers to those any more (extraction drops a chunk's when its commit is done), else
        new. New memory is mapped on its first write, a page fault per page: on MiniLM's chunks
        (270 MB) about 0.2 s of CPU each under load, more than pooling them. (New memory comes from
        numpy, which asks Linux for huge pages for large arrays, about half the faults' CPU of torch's
        memory when there are huge pages to be had.)"""
        size = int(np.prod(shape))
        buffer = self._spare.pop() if self._spare else None
        if buffer is None or buffer.size < size:
            buffer = np.empty(size + size // 8, dtype=np.float32)  # room for a next chunk of a few more words
        return np.asarray(_Lease(buffer, shape, self._spare))

    def _batches(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Windows (by index) in batches, longest first: at most `max_batch_size` windows and
        `max_batch_tokens` padded ids each."""
        order = np.lexsort((np.arange(len(lengths)), -lengths)).tolist()
        sizes = lengths.tolist()
        batches: list[list[int]] = []
        batch: list[int] = []
        for w in order:
            # order is longest first, so the first window of a batch sets its padded length
            if batch and ((len(batch) + 1) * sizes[batch[0]] > self.max_batch_tokens or len(batch) == self.max_batch_size):
                batches.append(batch)
                batch = []
            batch.append(w)
        if batch:
            batches.append(batch)
        return [np.array(b, dtype=np.int64) for b in batches]


# Where transformers models keep the norm applied after their last block.
FINAL_NORMS = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f", "final_norm")


def final_norm(model: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
    """The model's final norm (a module named as in `FINAL_NORMS`, on the model or on its `decoder` /
    `language_model`) with its path, or None."""
    for owner in ("", "decoder", "language_model"):
        parent = getattr(model, owner, None) if owner else model
        for name in FINAL_NORMS:
            module = getattr(parent, name, None) if isinstance(parent, torch.nn.Module) else None
            if isinstance(module, torch.nn.Module):
                return (f"{owner}.{name}" if owner else name), module
    return None


@torch.inference_mode()
def describe_last_layer(model: torch.nn.Module, tokenizer: Any, device: torch.device) -> dict[str, Any]:
    """Which tensor the model's last hidden state is, as the store records it: `position` is
    `after final norm` (the final norm's output), `before final norm` (its input) or `no final norm`
    (the last block's output as it is, as in BERT-style encoders), with the norm's name and why. A
    final norm found by name (`final_norm`) is told apart by one forward pass on a short input whose
    last hidden state is compared with the norm's input and output, caught by a hook."""
    config: Any = model.config
    blocks = int(config.num_hidden_layers)
    kind = type(model).__name__
    found = final_norm(model)
    if found is None:
        return {"position": "no final norm", "final_norm": None,
                "why": f"{kind} has no final norm ({', '.join(FINAL_NORMS)}): layer {blocks} is block {blocks}'s output"}
    name, module = found
    seen: dict[str, torch.Tensor] = {}

    def hook(_module: torch.nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
        seen["input"], seen["output"] = inputs[0], output[0] if isinstance(output, tuple) else output

    ids = tokenizer("The bank.")["input_ids"]
    handle = module.register_forward_hook(hook)
    try:
        last = model(input_ids=torch.tensor([ids], device=device), output_hidden_states=True, use_cache=False).hidden_states[-1]
    finally:
        handle.remove()
    norm = f"`{name}` ({type(module).__name__})"
    if "output" in seen and torch.equal(last, seen["output"]):
        return {"position": "after final norm", "final_norm": name,
                "why": f"{kind} applies its final norm {norm} to block {blocks}'s output, and its last hidden state "
                       "is the norm's output"}
    if "input" in seen and torch.equal(last, seen["input"]):
        return {"position": "before final norm", "final_norm": name,
                "why": f"{kind} has a final norm {norm}, but its last hidden state is the norm's input, block {blocks}'s output"}
    return {"position": "unknown", "final_norm": name,
            "why": f"{kind} has a module {norm} named like a final norm, but its last hidden state is neither its input nor its output"}


def model_max_length(model: torch.nn.Module, tokenizer: Any) -> int:
    """The longest input the model takes: its position limit, capped by the tokenizer's stated maximum."""
    config = model.config
    positions = [getattr(config, name, None) for name in ("max_position_embeddings", "n_positions")]
    limits = [int(x) for x in positions if isinstance(x, int) and x > 0]
    declared = getattr(tokenizer, "model_max_length", None)
    if isinstance(declared, int) and 0 < declared < 1_000_000:
        limits.append(declared)
    return min(limits) if limits else 512
