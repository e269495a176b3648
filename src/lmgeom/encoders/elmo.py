"""`ElmoEncoder`: an ELMo biLM behind the interface the extraction drives (`HFEncoder`'s)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from lmgeom.errors import InputError
from lmgeom.corpus.corpus import Sentence
from lmgeom.device import resolve_device
from lmgeom.elmo.chars import CHAR_VOCABULARY, batch_to_ids
from lmgeom.elmo.model import BiLMOutput, ElmoBiLM
from lmgeom.elmo.weights import OPTIONS_FILE, WEIGHTS_FILE, load_elmo
from lmgeom.encoders.base import EncodedSentence


def model_fingerprint(model: ElmoBiLM) -> str:
    """sha256 over the options, every parameter and the character vocabulary."""
    digest = hashlib.sha256()
    digest.update(model.config.fingerprint_text().encode())
    digest.update(CHAR_VOCABULARY.encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().float().contiguous().numpy().tobytes())
    digest.update("\n".join(model.vocab).encode())
    return digest.hexdigest()[:16]


class ElmoEncoder:
    """Every ELMo layer for each word of a sentence: the corpus words are ELMo's tokens (no
    sub-word pooling). Layer 0 is the char-CNN token layer (duplicated to 2 x projection_dim, as
    the published models expose it), layers 1..L the biLSTM layers. Sentences run statelessly."""

    def __init__(self, model: ElmoBiLM, *, model_id: str = "elmo", batch_size: int = 64) -> None:
        if model.stateful:
            raise ValueError("ElmoEncoder needs a stateless biLM (outputs must not depend on batch order)")
        self.model = model.eval()
        self.model_id = model_id
        self.batch_size = batch_size
        self.n_layers = model.config.n_layers + 1
        self.dim = model.config.output_dim
        self.model_fingerprint = model_fingerprint(model)
        self.layer_note = ("layer 0 is the character-CNN token embedding (ELMo's embedding output); layer l >= 1 is "
                           "the output of biLSTM layer l, forward and backward concatenated")

    @property
    def device(self) -> torch.device:
        return self.model.device

    def settings(self) -> dict[str, Any]:
        """What a store records about how its vectors were made."""
        return {
            "model_id": self.model_id,
            "model_fingerprint": self.model_fingerprint,
            "model_class": type(self.model).__name__,
            "n_layers": self.n_layers,
            "dim": self.dim,
            "pooling": "none (ELMo reads whole words)",
            "special_tokens": "excluded",
            "prepend_bos": False,
            "skip_unaligned": False,
            "max_length": None,
            "compute_dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "last_layer": {"position": "no final norm", "final_norm": None,
                           "why": f"ELMo has no norm: layer {self.n_layers - 1} is the outputs of its last biLSTM layer"},
        }

    @torch.inference_mode()
    def encode(self, sentences: Sequence[Sentence], *, first_index: int = 0,
               layers: Sequence[int] | None = None) -> list[EncodedSentence]:
        """Per-layer vectors of each sentence's words, the rows `ElmoBiLM.embed_sentences` gives, on its
        batches (`first_index` is unused: nothing here can fail per sentence). The rows of all
        sentences are written once, in corpus order, into one array that the sentences' vectors view,
        so the store's commit takes each layer's rows without another copy. Every layer, or `layers` only
        (ascending), in that order."""
        chosen = list(range(self.n_layers)) if layers is None else [int(layer) for layer in layers]
        words = [[w.text for w in sentence.words] for sentence in sentences]
        lengths = np.array([len(w) for w in words], dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        rows = np.empty((len(chosen), int(lengths.sum()), self.dim), dtype=np.float32)
        for batch in self.model.sentence_batches(lengths.tolist(), batch_size=self.batch_size):
            ids = batch_to_ids([words[i] for i in batch], self.model.config.max_characters_per_token)
            self._place_rows(self.model(ids.to(self.device)), batch, starts, lengths, rows, chosen)
        return [
            EncodedSentence(
                vectors=rows[:, start : start + length], words=w, is_special=np.zeros(length, dtype=bool),
                n_pieces=np.ones(length, dtype=np.int16), n_windows=1,
            )
            for start, length, w in zip(starts.tolist(), lengths.tolist(), words)
        ]

    @staticmethod
    def _place_rows(output: BiLMOutput, batch: list[int], starts: np.ndarray, lengths: np.ndarray, rows: np.ndarray,
                    layers: Sequence[int]) -> None:
        """Copy each sentence's words (without `<S>`/`</S>`) of every layer, the values
        `BiLMOutput.layers` holds, straight from the biLM's outputs into `rows` (the token layer into
        both halves): building `layers()` first would copy the batch twice more into new memory."""
        half = output.token.shape[-1]
        layer_halves = [(output.token, output.token), *zip(output.forward, output.backward)]
        for slot, layer in enumerate(layers):
            for side, values in enumerate(layer_halves[layer]):
                source = values.cpu().numpy()
                target = rows[slot, :, side * half : (side + 1) * half]
                for row, index in enumerate(batch):
                    start, length = starts[index], lengths[index]
                    target[start : start + length] = source[row, 1 : length + 1]


def load_elmo_encoder(
    path_or_options: str | Path, weights: str | Path | None = None, *, device: str = "auto", model_id: str | None = None,
) -> ElmoEncoder:
    """An `ElmoEncoder` from a folder (``options.json`` and ``weights.hdf5``, as `lmgeom elmo train`
    writes, or its only ``*.json`` and ``*.hdf5``), or from an options file and a weights file."""
    path = Path(path_or_options)
    if weights is None:
        if not path.is_dir():
            raise InputError(f"{path} is not a folder; give a folder with an options .json and a weights .hdf5, or both files")
        options = [path / OPTIONS_FILE] if (path / OPTIONS_FILE).is_file() else sorted(path.glob("*.json"))
        found = [path / WEIGHTS_FILE] if (path / WEIGHTS_FILE).is_file() else sorted([*path.glob("*.hdf5"), *path.glob("*.h5")])
        if len(options) != 1 or len(found) != 1:
            raise InputError(
                f"{path} must hold {OPTIONS_FILE} and {WEIGHTS_FILE}, or exactly one .json and one .hdf5 "
                f"(found {[o.name for o in options]} and {[f.name for f in found]}); pass the two files instead"
            )
        options_file, weight_file = options[0], found[0]
    else:
        options_file, weight_file = path, Path(weights)
    model = load_elmo(options_file, weight_file, device=resolve_device(device))
    return ElmoEncoder(model, model_id=model_id or (path.name if weights is None else weight_file.stem))
