"""Reading and writing ELMo models in the published layout: an options JSON and a weights HDF5
(bilm-tf's `dump_weights`, read by AllenNLP), plus the softmax when a model was trained here.

Every tensor is mapped explicitly (`tensor_map`); a missing, extra or mis-shaped tensor is an error
naming it. The published files' quirks, undone on load and redone on save:

- `char_embed` has 261 rows; the all-zero row for the "no token" id 0 is prepended (262 ids).
- `CNN/W_cnn_i` is TensorFlow's conv2d kernel [1, width, char_dim, n_filters].
- Matrices are TensorFlow's [in, out] (transposed for `nn.Linear`).
- Each `LSTMCell/W_0` stacks the input and the recurrent kernel, [input + hidden, 4 * dim], gates in
  TensorFlow's order i, j, f, o (PyTorch: i, f, g, o); `B` is the bias without the 1.0 TensorFlow
  adds to the forget gate at run time; `W_P_0` is the projection [dim, projection_dim].
- `RNN_0` is the forward LM, `RNN_1` the backward one; `Cell{k}` is layer k.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, cast

import h5py
import numpy as np
import torch
from torch import nn

from lmgeom.errors import InputError
from lmgeom.elmo.chars import STORED_CHARACTERS
from lmgeom.elmo.model import ElmoBiLM, ElmoConfig, Highway, lstm_parameter
from lmgeom.atomic import atomic_write, atomic_write_text

VOCAB_DATASET = "softmax/vocab"
OPTIONS_FILE = "options.json"  # names used when a model is saved into a folder
WEIGHTS_FILE = "weights.hdf5"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the file: its shape there, and how it maps to and from the module."""

    shape: tuple[int, ...]
    get: Callable[[], np.ndarray]  # module -> file layout
    put: Callable[[np.ndarray], None]  # file layout -> module


def _swap_gates(x: np.ndarray, dim: int) -> np.ndarray:
    """TensorFlow's gate blocks (i, j, f, o) <-> PyTorch's (i, f, g, o): swapping the middle two
    blocks along the first axis is its own inverse."""
    return np.concatenate([x[:dim], x[2 * dim : 3 * dim], x[dim : 2 * dim], x[3 * dim :]])


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float32)


def _copy(target: torch.Tensor, value: np.ndarray) -> None:
    with torch.no_grad():
        target.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def _plain(target: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(target.shape), lambda: _numpy(target), lambda value: _copy(target, value))


def _transposed(target: torch.Tensor) -> TensorSpec:
    """A TensorFlow [in, out] matrix held as PyTorch's [out, in]."""
    return TensorSpec(tuple(target.shape)[::-1], lambda: _numpy(target).T, lambda value: _copy(target, value.T))


def _conv_kernel(conv: nn.Conv1d) -> TensorSpec:
    """TensorFlow's conv2d kernel [1, width, char_dim, n_filters] held as Conv1d's [n_filters, char_dim, width]."""
    n, char_dim, width = conv.weight.shape
    return TensorSpec(
        (1, width, char_dim, n), lambda: _numpy(conv.weight).transpose(2, 1, 0)[None],
        lambda value: _copy(conv.weight, value[0].transpose(2, 1, 0)),
    )


def _char_embedding(embedding: torch.Tensor) -> TensorSpec:
    """The file has no row for id 0 ("no token"): it is all zeros here."""

    def put(value: np.ndarray) -> None:
        with torch.no_grad():
            embedding[0].zero_()
            embedding[1:].copy_(torch.from_numpy(value))

    return TensorSpec((STORED_CHARACTERS, embedding.shape[1]), lambda: _numpy(embedding[1:]), put)


def _lstm_kernel(lstm: nn.LSTM) -> TensorSpec:
    """`W_0` = [input kernel; recurrent kernel] as [input + hidden, 4 * dim], gates i, j, f, o."""
    w_ih, w_hh = lstm_parameter(lstm, "weight_ih"), lstm_parameter(lstm, "weight_hh")
    dim, input_size, hidden = lstm.hidden_size, w_ih.shape[1], w_hh.shape[1]

    def get() -> np.ndarray:
        return _swap_gates(np.concatenate([_numpy(w_ih), _numpy(w_hh)], axis=1), dim).T

    def put(value: np.ndarray) -> None:
        stacked = _swap_gates(value.T, dim)
        _copy(w_ih, stacked[:, :input_size])
        _copy(w_hh, stacked[:, input_size:])

    return TensorSpec((input_size + hidden, 4 * dim), get, put)


def _lstm_bias(lstm: nn.LSTM) -> TensorSpec:
    """`B`, gates i, j, f, o; TensorFlow's forget bias of 1.0 stays in the frozen `bias_hh`."""
    bias = lstm_parameter(lstm, "bias_ih")
    dim = lstm.hidden_size
    return TensorSpec((4 * dim,), lambda: _swap_gates(_numpy(bias), dim), lambda value: _copy(bias, _swap_gates(value, dim)))


def tensor_map(model: ElmoBiLM) -> dict[str, TensorSpec]:
    """Every tensor of the published layout for this model's configuration, by its name in the file."""
    cnn = model.char_cnn
    specs: dict[str, TensorSpec] = {"char_embed": _char_embedding(cnn.char_embedding.weight)}
    for i, conv in enumerate(cast(list[nn.Conv1d], list(cnn.convolutions))):
        specs[f"CNN/W_cnn_{i}"] = _conv_kernel(conv)
        specs[f"CNN/b_cnn_{i}"] = _plain(cast(torch.Tensor, conv.bias))
    for k, highway in enumerate(cast(list[Highway], list(cnn.highways))):
        for kind, linear in (("carry", highway.carry), ("transform", highway.transform)):
            specs[f"CNN_high_{k}/W_{kind}"] = _transposed(linear.weight)
            specs[f"CNN_high_{k}/b_{kind}"] = _plain(linear.bias)
    if cnn.projection is not None:
        specs["CNN_proj/W_proj"] = _transposed(cnn.projection.weight)
        specs["CNN_proj/b_proj"] = _plain(cnn.projection.bias)
    for direction_index, direction in enumerate(("forward", "backward")):
        for layer, lstm in enumerate(model.direction_layers(direction)):
            root = f"RNN_{direction_index}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"
            specs[f"{root}/W_0"] = _lstm_kernel(lstm)
            specs[f"{root}/B"] = _lstm_bias(lstm)
            if lstm.proj_size:
                specs[f"{root}/W_P_0"] = _transposed(lstm_parameter(lstm, "weight_hr"))
    if model.softmax is not None:
        specs["softmax/W"] = _plain(model.softmax.weight)  # [n_tokens_vocab, projection_dim] in both
        specs["softmax/b"] = _plain(model.softmax.bias)
    return specs


def read_options(options_file: str | Path) -> dict:
    path = Path(options_file)
    if not path.is_file():
        raise FileNotFoundError(f"ELMo options file not found: {path}")
    try:
        options = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path} is not valid JSON ({error.msg}, line {error.lineno}); give an ELMo options file") from None
    if not isinstance(options, dict):
        raise InputError(f"{path} is not an ELMo options file (a JSON object with 'lstm' and 'char_cnn')")
    return options


def load_elmo(
    options_file: str | Path, weight_file: str | Path, *, device: str | torch.device = "cpu", stateful: bool = False,
) -> ElmoBiLM:
    """An `ElmoBiLM` (eval mode) from an options JSON and a weights HDF5 in the bilm-tf layout
    (the published models, or one saved by `save_elmo`). The softmax is loaded when the file has one."""
    config = ElmoConfig.from_options(read_options(options_file), source=str(options_file))
    path = Path(weight_file)
    if not path.is_file():
        raise FileNotFoundError(f"ELMo weights file not found: {path}")
    try:
        handle = h5py.File(path, "r")
    except OSError as error:
        raise InputError(f"{path} is not an HDF5 file ({error}); give the ELMo weights .hdf5") from None
    with handle:
        datasets: dict[str, h5py.Dataset] = {}

        def collect(name: str, item: object) -> None:  # visititems stops at the first non-None return
            if isinstance(item, h5py.Dataset):
                datasets[name] = item

        handle.visititems(collect)
        vocab: list[str] | None = None
        if "softmax/W" in datasets:
            rows = int(datasets["softmax/W"].shape[0])
            if config.n_tokens_vocab and config.n_tokens_vocab != rows:
                raise InputError(
                    f"{path}: tensor softmax/W has {rows} rows but the options give n_tokens_vocab={config.n_tokens_vocab}"
                )
            config = dataclasses.replace(config, n_tokens_vocab=rows)
            if VOCAB_DATASET in datasets:
                vocab = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in datasets[VOCAB_DATASET][()]]
        else:
            config = dataclasses.replace(config, n_tokens_vocab=0)
        model = ElmoBiLM(config, vocab=vocab, stateful=stateful)
        specs = tensor_map(model)
        missing = [name for name in specs if name not in datasets]
        if missing:
            raise InputError(
                f"{path} does not match {options_file}: tensor {missing[0]} is missing"
                + (f" (and {len(missing) - 1} more: {', '.join(missing[1:4])}...)" if len(missing) > 1 else "")
            )
        extra = sorted(set(datasets) - set(specs) - {VOCAB_DATASET})
        if extra:
            raise InputError(
                f"{path} does not match {options_file}: tensor {extra[0]} is not part of the model the options describe"
                + (f" ({len(extra)} such tensors)" if len(extra) > 1 else "")
            )
        for name, spec in specs.items():
            value = datasets[name][()]
            if tuple(value.shape) != spec.shape:
                hint = ""
                if name == "char_embed":
                    hint = f" (ELMo's character vocabulary: {STORED_CHARACTERS} rows, 256 bytes + 5 markers)"
                raise InputError(f"{path}: tensor {name} has shape {tuple(value.shape)}, expected {spec.shape}{hint}")
            spec.put(np.asarray(value, dtype=np.float32))
    return model.to(device).eval()


def save_elmo(model: ElmoBiLM, options_file: str | Path, weight_file: str | Path) -> None:
    """Write the options JSON and the weights HDF5 in the published layout (`load_elmo` reads them);
    the softmax and its vocabulary (`softmax/vocab`) are added when the model has them."""
    atomic_write_text(options_file, json.dumps(model.config.to_options(), indent=2) + "\n")

    def write(tmp: Path) -> None:
        with h5py.File(tmp, "w") as handle:
            for name, spec in tensor_map(model).items():
                handle.create_dataset(name, data=spec.get().astype(np.float32))
            if model.softmax is not None and model.vocab:
                handle.create_dataset(VOCAB_DATASET, data=np.array(model.vocab, dtype=h5py.string_dtype("utf-8")))

    atomic_write(weight_file, write)
