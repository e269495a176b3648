"""The ELMo biLM (Peters et al. 2018): a character CNN token encoder and forward and backward
stacks of projected LSTMs, with one softmax shared by both directions.

Parameters are kept in the shapes PyTorch uses (`nn.Conv1d`, `nn.Linear`, one `nn.LSTM` per layer
and direction); `lmgeom.elmo.weights` maps them to and from the bilm-tf HDF5 layout. The LSTM
follows TensorFlow's `LSTMCell` (what the published models were trained with): the forget gate
gets a constant bias of 1.0 (held in the frozen `bias_hh` of each `nn.LSTM`), the memory cell is
clipped to `cell_clip`, then projected and clipped to `proj_clip`. Without clipping the fast
`nn.LSTM` kernel runs; with it, an explicit loop over time steps.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence, cast

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from lmgeom.device import ieee_float32
from lmgeom.errors import InputError
from lmgeom.elmo.chars import MAX_CHARACTERS, N_CHARACTERS, STORED_CHARACTERS, batch_to_ids

ACTIVATIONS = ("relu", "tanh")
UNK_TOKEN = "<UNK>"


@dataclass(frozen=True)
class ElmoConfig:
    """The architecture, as the bilm-tf options JSON describes it (`to_options` / `from_options`)."""

    filters: tuple[tuple[int, int], ...] = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256))
    char_embedding_dim: int = 16
    n_highway: int = 1
    activation: str = "relu"
    max_characters_per_token: int = MAX_CHARACTERS
    lstm_dim: int = 512
    projection_dim: int = 128
    n_layers: int = 2
    cell_clip: float | None = None
    proj_clip: float | None = None
    use_skip_connections: bool = True
    n_tokens_vocab: int = 0  # softmax size; 0 = no softmax (published files ship none)
    dropout: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # recorded in the options under "lmgeom"

    def __post_init__(self) -> None:
        object.__setattr__(self, "filters", tuple((int(w), int(n)) for w, n in self.filters))
        if self.activation not in ACTIVATIONS:
            raise InputError(f"char_cnn.activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if not self.filters or any(w < 1 or n < 1 for w, n in self.filters):
            raise InputError(f"char_cnn.filters must be a non-empty list of [width, n_filters] pairs, got {self.filters}")
        if max(w for w, _ in self.filters) > self.max_characters_per_token:
            raise InputError("a char_cnn filter is wider than max_characters_per_token")
        if self.projection_dim > self.lstm_dim:
            raise InputError(f"lstm.projection_dim ({self.projection_dim}) must not exceed lstm.dim ({self.lstm_dim})")
        if self.n_filters < self.projection_dim:
            raise InputError(f"the char CNN has {self.n_filters} filters, fewer than lstm.projection_dim ({self.projection_dim})")
        if self.n_layers < 1:
            raise InputError("lstm.n_layers must be at least 1")

    @property
    def n_filters(self) -> int:
        return sum(n for _, n in self.filters)

    @property
    def clipping(self) -> bool:
        return bool(self.cell_clip) or bool(self.proj_clip)

    @property
    def output_dim(self) -> int:
        """Width of every representation layer: forward and backward side by side."""
        return 2 * self.projection_dim

    def to_options(self) -> dict[str, Any]:
        """The options JSON of bilm-tf / AllenNLP."""
        options: dict[str, Any] = {
            "bidirectional": True,
            "char_cnn": {
                "activation": self.activation,
                "embedding": {"dim": self.char_embedding_dim},
                "filters": [list(f) for f in self.filters],
                "max_characters_per_token": self.max_characters_per_token,
                "n_characters": N_CHARACTERS,
                "n_highway": self.n_highway,
            },
            "dropout": self.dropout,
            "lstm": {
                "cell_clip": self.cell_clip,
                "dim": self.lstm_dim,
                "n_layers": self.n_layers,
                "proj_clip": self.proj_clip,
                "projection_dim": self.projection_dim,
                "use_skip_connections": self.use_skip_connections,
            },
        }
        if self.n_tokens_vocab:
            options["n_tokens_vocab"] = self.n_tokens_vocab
        if self.extra:
            options["lmgeom"] = self.extra
        return options

    @classmethod
    def from_options(cls, options: dict[str, Any], *, source: str = "options") -> "ElmoConfig":
        def get(section: str, key: str, default: Any = ...) -> Any:
            if section not in options or not isinstance(options[section], dict):
                raise InputError(f"{source}: no {section!r} section; an ELMo options file has 'lstm' and 'char_cnn'")
            if key not in options[section]:
                if default is ...:
                    raise InputError(f"{source}: {section}.{key} is missing")
                return default
            return options[section][key]

        n_characters = get("char_cnn", "n_characters")
        if n_characters not in (STORED_CHARACTERS, N_CHARACTERS):
            raise InputError(
                f"{source}: char_cnn.n_characters is {n_characters}; ELMo's character vocabulary has "
                f"{N_CHARACTERS} ids ({STORED_CHARACTERS} in training files, before the padding row)"
            )
        embedding = get("char_cnn", "embedding")
        try:
            return cls(
                filters=tuple(tuple(f) for f in get("char_cnn", "filters")),
                char_embedding_dim=int(embedding["dim"]),
                n_highway=int(get("char_cnn", "n_highway", 0) or 0),
                activation=get("char_cnn", "activation"),
                max_characters_per_token=int(get("char_cnn", "max_characters_per_token")),
                lstm_dim=int(get("lstm", "dim")),
                projection_dim=int(get("lstm", "projection_dim")),
                n_layers=int(get("lstm", "n_layers", 1)),
                cell_clip=get("lstm", "cell_clip", None),
                proj_clip=get("lstm", "proj_clip", None),
                use_skip_connections=bool(get("lstm", "use_skip_connections", False)),
                n_tokens_vocab=int(options.get("n_tokens_vocab", 0) or 0),
                dropout=float(options.get("dropout", 0.0) or 0.0),
                extra=dict(options.get("lmgeom", {})),
            )
        except (TypeError, KeyError) as error:
            raise InputError(f"{source}: malformed ELMo options ({error!r})") from None

    def fingerprint_text(self) -> str:
        return json.dumps(self.to_options(), sort_keys=True)


class Highway(nn.Module):
    """bilm-tf's highway layer: g = sigmoid(x W_carry + b_carry), y = g * relu(x W_transform + b_transform) + (1 - g) * x.

    The gate named "carry" in the published files multiplies the transform (AllenNLP negates it to
    fit its own convention); ReLU is fixed whatever the CNN activation."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.carry = nn.Linear(dim, dim)
        self.transform = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.carry(x))
        return gate * torch.relu(self.transform(x)) + (1.0 - gate) * x


class CharCNN(nn.Module):
    """Token representation from characters: embeddings, convolutions of several widths, max over
    positions, activation, highway layers, linear projection to `projection_dim`."""

    def __init__(self, config: ElmoConfig) -> None:
        super().__init__()
        self.config = config
        self.char_embedding = nn.Embedding(N_CHARACTERS, config.char_embedding_dim, padding_idx=0)
        self.convolutions = nn.ModuleList(
            nn.Conv1d(config.char_embedding_dim, n, width) for width, n in config.filters
        )
        self.highways = nn.ModuleList(Highway(config.n_filters) for _ in range(config.n_highway))
        # bilm-tf projects only when the filters do not already have the LSTM's width
        self.projection = nn.Linear(config.n_filters, config.projection_dim) if config.n_filters != config.projection_dim else None
        self.activation = torch.relu if config.activation == "relu" else torch.tanh

    def forward(self, char_ids: torch.Tensor) -> torch.Tensor:
        """(..., max_characters) ids -> (..., projection_dim). Each distinct token is encoded once."""
        shape = char_ids.shape[:-1]
        flat = char_ids.reshape(-1, char_ids.shape[-1])
        unique, inverse = torch.unique(flat, dim=0, return_inverse=True)
        embedded = self.char_embedding(unique).transpose(1, 2)  # (n, char_dim, max_characters)
        x = torch.cat([self.activation(conv(embedded).amax(dim=-1)) for conv in self.convolutions], dim=-1)
        for highway in self.highways:
            x = highway(x)
        if self.projection is not None:
            x = self.projection(x)
        return x[inverse].reshape(*shape, -1)


LSTMState = tuple[torch.Tensor, torch.Tensor]  # (h, c) of one layer, each (batch, width)


def lstm_parameter(lstm: nn.LSTM, name: str) -> torch.Tensor:
    """A parameter of a one-layer `nn.LSTM` by short name: weight_ih, weight_hh, bias_ih, bias_hh, weight_hr."""
    return cast(torch.Tensor, getattr(lstm, f"{name}_l0"))


def run_lstm(
    lstm: nn.LSTM, inputs: torch.Tensor, lengths: torch.Tensor, state: LSTMState,
    *, cell_clip: float | None, proj_clip: float | None, need_final_state: bool = True,
) -> tuple[torch.Tensor, LSTMState | None]:
    """One (projected) LSTM layer over left-aligned sequences of `lengths`; positions past a
    sequence's end give zeros and leave its state alone. Returns outputs and final states (None
    unless `need_final_state`: then the padded batch runs unpacked, which is much faster on CPU and
    gives the same outputs, since a position never sees the padding after it)."""
    if not (cell_clip or proj_clip):
        initial = (state[0].unsqueeze(0), state[1].unsqueeze(0))
        if not need_final_state:
            with warnings.catch_warnings():  # the CPU build says, every call, that oneDNN has no projected LSTM
                warnings.filterwarnings("ignore", message="LSTM with projections is not supported")
                output, _ = lstm(inputs, initial)
            valid = torch.arange(inputs.shape[1], device=inputs.device)[None, :] < lengths[:, None]
            return output.masked_fill(~valid.unsqueeze(-1), 0.0), None
        packed = pack_padded_sequence(inputs, lengths.cpu(), batch_first=True, enforce_sorted=False)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LSTM with projections is not supported")
            output, (h, c) = lstm(packed, initial)
        padded, _ = pad_packed_sequence(output, batch_first=True, total_length=inputs.shape[1])
        return padded, (h.squeeze(0), c.squeeze(0))
    h, c = state
    projected_inputs = nn.functional.linear(inputs, lstm_parameter(lstm, "weight_ih"), lstm_parameter(lstm, "bias_ih"))
    outputs = []
    for t in range(inputs.shape[1]):
        gates = projected_inputs[:, t] + nn.functional.linear(h, lstm_parameter(lstm, "weight_hh"), lstm_parameter(lstm, "bias_hh"))
        i, f, g, o = gates.chunk(4, dim=-1)
        new_c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        if cell_clip:
            new_c = new_c.clamp(-cell_clip, cell_clip)
        new_h = torch.sigmoid(o) * torch.tanh(new_c)
        if lstm.proj_size:
            new_h = nn.functional.linear(new_h, lstm_parameter(lstm, "weight_hr"))
        if proj_clip:
            new_h = new_h.clamp(-proj_clip, proj_clip)
        active = (t < lengths).unsqueeze(-1)
        c = torch.where(active, new_c, c)
        h = torch.where(active, new_h, h)
        outputs.append(new_h * active)
    return torch.stack(outputs, dim=1), (h, c)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each sequence's first `lengths[b]` positions (tf.reverse_sequence); padding stays put."""
    positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    index = torch.where(positions < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - positions, positions)
    return x.gather(1, index.unsqueeze(-1).expand_as(x))


@dataclass
class BiLMOutput:
    """Activations of a batch including the `<S>`/`</S>` positions."""

    token: torch.Tensor  # (batch, time, projection_dim)
    forward: list[torch.Tensor]  # per LSTM layer, (batch, time, projection_dim)
    backward: list[torch.Tensor]
    lengths: torch.Tensor  # (batch,) tokens including <S> and </S>

    def layers(self) -> torch.Tensor:
        """(n_layers + 1, batch, time, 2 * projection_dim): the token layer duplicated, then each
        LSTM layer's forward and backward outputs side by side (the published models' layers)."""
        token = torch.cat([self.token, self.token], dim=-1)
        return torch.stack([token, *(torch.cat(pair, dim=-1) for pair in zip(self.forward, self.backward))])


class ElmoBiLM(nn.Module):
    """The ELMo biLM. Stateless by default: every sentence starts from a zero LSTM state, so its
    outputs do not depend on the batch or on earlier calls. `stateful=True` carries each batch
    row's final states into the same row of the next call, as bilm-tf and AllenNLP do."""

    def __init__(self, config: ElmoConfig, *, vocab: Sequence[str] | None = None, stateful: bool = False) -> None:
        super().__init__()
        self.config = config
        self.stateful = stateful
        self.char_cnn = CharCNN(config)
        proj_size = config.projection_dim if config.projection_dim < config.lstm_dim else 0
        self.forward_layers = nn.ModuleList(
            nn.LSTM(config.projection_dim, config.lstm_dim, proj_size=proj_size, batch_first=True)
            for _ in range(config.n_layers)
        )
        self.backward_layers = nn.ModuleList(
            nn.LSTM(config.projection_dim, config.lstm_dim, proj_size=proj_size, batch_first=True)
            for _ in range(config.n_layers)
        )
        for lstm in self.lstms():
            # TensorFlow's constant forget bias (1.0) lives in bias_hh, frozen; bias_ih is the file's `B`.
            lstm_parameter(lstm, "bias_hh").requires_grad_(False)
        self.dropout = nn.Dropout(config.dropout)
        self.softmax: nn.Linear | None = None
        self.vocab: list[str] = []
        if config.n_tokens_vocab:
            if vocab is not None and len(vocab) != config.n_tokens_vocab:
                raise InputError(f"vocab has {len(vocab)} words but the options give n_tokens_vocab={config.n_tokens_vocab}")
            self.softmax = nn.Linear(config.projection_dim, config.n_tokens_vocab)
            self.vocab = list(vocab) if vocab is not None else []
        self._states: dict[str, list[LSTMState]] | None = None
        self.reset_parameters()

    def direction_layers(self, direction: str) -> list[nn.LSTM]:
        """The LSTM layers of one direction ("forward" or "backward"), bottom first."""
        layers = self.forward_layers if direction == "forward" else self.backward_layers
        return cast(list[nn.LSTM], list(layers))

    def lstms(self) -> list[nn.LSTM]:
        return [*self.direction_layers("forward"), *self.direction_layers("backward")]

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """bilm-tf's initialisers."""
        config = self.config
        nn.init.uniform_(self.char_cnn.char_embedding.weight, -1.0, 1.0)
        self.char_cnn.char_embedding.weight[0].zero_()
        for (width, _), conv in zip(config.filters, cast(list[nn.Conv1d], list(self.char_cnn.convolutions))):
            if config.activation == "relu":
                nn.init.uniform_(conv.weight, -0.05, 0.05)
            else:
                nn.init.normal_(conv.weight, 0.0, math.sqrt(1.0 / (width * config.char_embedding_dim)))
            nn.init.zeros_(cast(torch.Tensor, conv.bias))
        for highway in cast(list[Highway], list(self.char_cnn.highways)):
            for linear, bias in ((highway.carry, -2.0), (highway.transform, 0.0)):
                nn.init.normal_(linear.weight, 0.0, math.sqrt(1.0 / config.n_filters))
                nn.init.constant_(linear.bias, bias)
        if self.char_cnn.projection is not None:
            nn.init.normal_(self.char_cnn.projection.weight, 0.0, math.sqrt(1.0 / config.n_filters))
            nn.init.zeros_(self.char_cnn.projection.bias)
        for lstm in self.lstms():
            nn.init.xavier_uniform_(lstm_parameter(lstm, "weight_ih"))
            nn.init.xavier_uniform_(lstm_parameter(lstm, "weight_hh"))
            if lstm.proj_size:
                nn.init.xavier_uniform_(lstm_parameter(lstm, "weight_hr"))
            nn.init.zeros_(lstm_parameter(lstm, "bias_ih"))
            lstm_parameter(lstm, "bias_hh").copy_(forget_bias(config.lstm_dim))
        if self.softmax is not None:
            nn.init.normal_(self.softmax.weight, 0.0, 1.0 / math.sqrt(config.projection_dim))
            nn.init.zeros_(self.softmax.bias)

    # ---- running ---------------------------------------------------------------------------
    def reset_states(self) -> None:
        """Forget carried-over states (stateful mode)."""
        self._states = None

    def _initial_states(self, direction: str, batch: int, reference: torch.Tensor) -> list[LSTMState]:
        widths = (self.config.projection_dim, self.config.lstm_dim)
        zeros = [(reference.new_zeros(batch, widths[0]), reference.new_zeros(batch, widths[1])) for _ in range(self.config.n_layers)]
        if not self.stateful or self._states is None or not self._states[direction]:
            return zeros
        carried = []
        for (h0, c0), (h, c) in zip(zeros, self._states[direction]):
            rows = min(batch, h.shape[0])
            h0[:rows], c0[:rows] = h[:rows], c[:rows]
            carried.append((h0, c0))
        return carried

    def _keep_states(self, direction: str, finals: list[LSTMState]) -> None:
        if self._states is None:
            self._states = {"forward": [], "backward": []}
        kept = self._states[direction]
        updated = []
        for layer, (h, c) in enumerate(finals):
            h, c = h.detach(), c.detach()
            if layer < len(kept) and kept[layer][0].shape[0] > h.shape[0]:
                # rows beyond this batch keep their state (bilm-tf keeps max_batch_size rows)
                h = torch.cat([h, kept[layer][0][h.shape[0]:]])
                c = torch.cat([c, kept[layer][1][c.shape[0]:]])
            updated.append((h, c))
        self._states[direction] = updated

    def forward(self, char_ids: torch.Tensor) -> BiLMOutput:
        """`char_ids`: (batch, time, max_characters) from `batch_to_ids` (with `<S>`/`</S>`)."""
        if char_ids.dim() != 3 or char_ids.shape[-1] != self.config.max_characters_per_token:
            raise ValueError(
                f"expected character ids of shape (batch, time, {self.config.max_characters_per_token}), got {tuple(char_ids.shape)}"
            )
        lengths = (char_ids > 0).any(dim=-1).sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("a batch row holds no token; every row needs at least <S> and </S> (use batch_to_ids)")
        with ieee_float32():  # the char CNN's convolutions and the LSTMs as on the CPU, also on a GPU
            return self._forward(char_ids, lengths)

    def _forward(self, char_ids: torch.Tensor, lengths: torch.Tensor) -> BiLMOutput:
        token = self.char_cnn(char_ids)
        clip = dict(cell_clip=self.config.cell_clip, proj_clip=self.config.proj_clip)
        outputs: dict[str, list[torch.Tensor]] = {}
        for direction in ("forward", "backward"):
            layers = self.direction_layers(direction)
            x = token if direction == "forward" else reverse_padded(token, lengths)
            states = self._initial_states(direction, x.shape[0], x)
            finals: list[LSTMState] = []
            direction_outputs = []
            for index, (lstm, state) in enumerate(zip(layers, states)):
                x = self.dropout(x)  # on each layer's input, as bilm-tf's DropoutWrapper
                output, final = run_lstm(lstm, x, lengths, state, need_final_state=self.stateful, **clip)
                if index > 0 and self.config.use_skip_connections:
                    output = output + x
                if final is not None:
                    finals.append(final)
                direction_outputs.append(output)
                x = output
            if self.stateful:
                self._keep_states(direction, finals)
            if direction == "backward":
                direction_outputs = [reverse_padded(o, lengths) for o in direction_outputs]
            outputs[direction] = direction_outputs
        return BiLMOutput(token, outputs["forward"], outputs["backward"], lengths)

    @property
    def device(self) -> torch.device:
        return self.char_cnn.char_embedding.weight.device

    @torch.inference_mode()
    def embed_sentences(self, sentences: Sequence[Sequence[str]], *, batch_size: int = 64) -> list[np.ndarray]:
        """Per sentence, (n_layers + 1, n_words, 2 * projection_dim) in the model's dtype (float32
        unless converted): the token layer, then
        LSTM layers 1..L; `<S>`/`</S>` removed. An empty sentence gives 0 rows (it is still run as
        ``<S> </S>``, which matters only in stateful mode). Stateless mode batches sentences by
        length; stateful mode keeps the given order, `batch_size` sentences a batch, row i of each
        batch continuing row i of the previous one."""
        if isinstance(sentences, str) or any(isinstance(s, str) for s in sentences):
            raise TypeError("embed_sentences takes a list of sentences, each a list of word strings")
        was_training = self.training
        self.eval()
        results: list[np.ndarray] = [np.empty(0)] * len(sentences)
        try:
            for batch in self.sentence_batches([len(s) for s in sentences], batch_size=batch_size):
                ids = batch_to_ids([sentences[i] for i in batch], self.config.max_characters_per_token)
                layers = self(ids.to(self.device)).layers().cpu().numpy()
                for row, index in enumerate(batch):
                    results[index] = np.ascontiguousarray(layers[:, row, 1 : len(sentences[index]) + 1])
        finally:
            self.train(was_training)
        return results

    def sentence_batches(self, lengths: Sequence[int], *, batch_size: int = 64) -> list[list[int]]:
        """Indexes of the sentences (of `lengths` words) in each batch `embed_sentences` runs: longest
        first in stateless mode (less padding; ties keep their order), the given order when stateful."""
        order = list(range(len(lengths)))
        if not self.stateful:
            order.sort(key=lambda i: -lengths[i])
        return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]

    # ---- language-model loss -----------------------------------------------------------------
    def lm_losses(
        self, output: BiLMOutput, targets: torch.Tensor, *, n_negative_samples: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Summed negative log-likelihoods (forward, backward) and the number of predictions per
        direction. The forward LM at position t predicts token t+1 (ending with `</S>`), the backward
        LM at t predicts token t-1 (ending with `<S>`). `n_negative_samples` > 0 uses a sampled softmax
        (log-uniform candidates over the frequency-sorted vocabulary) instead of the full one."""
        if self.softmax is None:
            raise InputError("this biLM has no softmax (published weight files ship none); it cannot score text")
        targets = targets.to(output.token.device)
        forward_h = self.dropout(output.forward[-1][:, :-1])
        backward_h = self.dropout(output.backward[-1][:, 1:])
        forward_y, backward_y = targets[:, 1:], targets[:, :-1]
        # the backward LM at the last position (</S>) predicts the last word; padding rows are -1
        forward_mask = forward_y >= 0
        backward_mask = (torch.arange(targets.shape[1] - 1, device=targets.device)[None] < (output.lengths - 1)[:, None])
        losses = []
        for h, y, mask in ((forward_h, forward_y, forward_mask), (backward_h, backward_y, backward_mask)):
            h, y = h[mask], y[mask]
            if n_negative_samples:
                losses.append(sampled_softmax_nll(self.softmax, h, y, n_negative_samples).sum())
            else:
                losses.append(nn.functional.cross_entropy(self.softmax(h), y, reduction="sum"))
        return losses[0], losses[1], int(forward_mask.sum())


def forget_bias(lstm_dim: int) -> torch.Tensor:
    """PyTorch gate order i, f, g, o: 1.0 on the forget gate, as TensorFlow's LSTMCell adds."""
    bias = torch.zeros(4 * lstm_dim)
    bias[lstm_dim : 2 * lstm_dim] = 1.0
    return bias


def sampled_softmax_nll(softmax: nn.Linear, h: torch.Tensor, y: torch.Tensor, n_samples: int) -> torch.Tensor:
    """Sampled softmax (Jean et al. 2015, as TensorFlow's `sampled_softmax_loss`): the true class
    against `n_samples` log-uniform candidates shared by the batch, logits corrected by log Q,
    accidental hits removed. Assumes the vocabulary is sorted by falling frequency."""
    vocab_size = softmax.weight.shape[0]
    log_range = math.log(vocab_size + 1)
    uniform = torch.rand(n_samples, device=h.device)
    sampled = (torch.exp(uniform * log_range).long() - 1).clamp(0, vocab_size - 1)

    def log_expected(ids: torch.Tensor) -> torch.Tensor:
        q = (torch.log(ids.double() + 2) - torch.log(ids.double() + 1)) / log_range
        return torch.log(n_samples * q).to(h.dtype)

    true_logits = (h * softmax.weight[y]).sum(-1) + softmax.bias[y] - log_expected(y)
    sampled_logits = h @ softmax.weight[sampled].T + softmax.bias[sampled] - log_expected(sampled)
    sampled_logits = sampled_logits.masked_fill(sampled[None, :] == y[:, None], float("-inf"))
    logits = torch.cat([true_logits[:, None], sampled_logits], dim=1)
    return -torch.log_softmax(logits, dim=1)[:, 0]
