"""Training an ELMo biLM here: joint forward + backward LM loss, seeded, checkpointed, resumable.

`train` writes into its output folder `checkpoint.pt` (every `checkpoint_every` steps: model,
optimizer, RNG state and position in the epoch, so a killed run continues where its last
checkpoint was), and at the end `options.json` + `weights.hdf5` (the published layout plus the
softmax and its vocabulary; `load_elmo` reads them) and `training.json` (configuration, speed,
held-out perplexity).

Perplexity counts one prediction per word plus `</S>` (forward) or `<S>` (backward) per sentence;
a word outside the softmax vocabulary is a prediction of the single `<UNK>` class (as in bilm-tf),
so the numbers are only comparable between models with the same vocabulary. The held-out OOV rate
is reported next to them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from lmgeom.errors import InputError
from lmgeom.corpus.corpus import Corpus
from lmgeom.device import ieee_float32, resolve_device
from lmgeom.elmo.chars import BOS_TOKEN, EOS_TOKEN, bos_ids, eos_ids, word_ids
from lmgeom.elmo.model import UNK_TOKEN, ElmoBiLM, ElmoConfig
from lmgeom.elmo.weights import OPTIONS_FILE, WEIGHTS_FILE, save_elmo
from lmgeom.atomic import atomic_write, atomic_write_text, require_writable
from lmgeom.progress import NoProgress, Progress

CHECKPOINT_FILE = "checkpoint.pt"
REPORT_FILE = "training.json"


@dataclass(frozen=True)
class TrainConfig:
    """Architecture and optimisation. The defaults (about 5.6M parameters, 2.6M of them the
    softmax) are sized to train on the Brown corpus within an hour on 2 CPU cores (docs/models.md)."""

    filters: tuple[tuple[int, int], ...] = ((1, 32), (2, 32), (3, 64), (4, 128), (5, 256))
    char_embedding_dim: int = 16
    n_highway: int = 1
    activation: str = "relu"
    lstm_dim: int = 512
    projection_dim: int = 128
    n_layers: int = 2
    cell_clip: float | None = None  # None: the fast nn.LSTM kernel, recorded in the saved options
    proj_clip: float | None = None
    vocab_size: int = 20000  # softmax classes, including <S>, </S> and <UNK>
    n_negative_samples: int = 0  # 0: full softmax; > 0: sampled softmax with this many candidates
    dropout: float = 0.1
    epochs: int = 2
    batch_tokens: int = 2000  # padded tokens (with <S> and </S>) per batch
    learning_rate: float = 2e-3
    grad_clip: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "filters", tuple((int(w), int(n)) for w, n in self.filters))
        if self.vocab_size < 4:
            raise InputError("vocab_size must leave room for <S>, </S>, <UNK> and at least one word")
        if self.epochs < 1 or self.batch_tokens < 1:
            raise InputError("epochs and batch_tokens must be positive")

    def model_config(self, n_vocab: int) -> ElmoConfig:
        implementation = (
            "explicit loop with TensorFlow-style cell and projection clipping" if self.cell_clip or self.proj_clip
            else "torch.nn.LSTM(proj_size=...) fast path, no cell or projection clipping"
        )
        return ElmoConfig(
            filters=self.filters, char_embedding_dim=self.char_embedding_dim, n_highway=self.n_highway,
            activation=self.activation, lstm_dim=self.lstm_dim, projection_dim=self.projection_dim,
            n_layers=self.n_layers, cell_clip=self.cell_clip, proj_clip=self.proj_clip, n_tokens_vocab=n_vocab,
            dropout=self.dropout,
            extra={"trained_with": "lmgeom", "lstm_implementation": implementation,
                   "vocab": "softmax/vocab in the weights file", "training": dataclasses.asdict(self)},
        )


@dataclass(frozen=True)
class Perplexity:
    forward: float
    backward: float
    average: float  # exp of the mean of the two NLLs (the geometric mean of the two perplexities)
    n_predictions: int  # per direction: words + one sentence boundary per sentence
    oov_rate: float  # share of words outside the softmax vocabulary (scored as <UNK>)


@dataclass(frozen=True)
class TrainResult:
    out: Path
    complete: bool  # False when stopped by max_steps
    steps: int
    perplexity: Perplexity
    words_per_second: float


def build_vocab(sentences: Sequence[Sequence[str]], size: int) -> list[str]:
    """`<S>`, `</S>`, `<UNK>`, then the `size - 3` most frequent words (ties by spelling), most
    frequent first (the order the sampled softmax's log-uniform sampler assumes)."""
    counts = Counter(word for sentence in sentences for word in sentence)
    for special in (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN):
        counts.pop(special, None)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[: size - 3]
    return [BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, *(word for word, _ in ranked)]


def split_corpus(spec: str) -> tuple[Corpus, Corpus]:
    """(train, held-out): Brown by its fixed file split (`lmgeom.corpus.splits`); any other corpus
    spec (see `load_corpus`) holds out every tenth sentence."""
    from lmgeom.corpus.builtin import load_corpus
    from lmgeom.corpus.splits import brown_split

    name, _, argument = spec.partition(":")
    if name == "brown" and not Path(spec).exists():
        return brown_split(argument or None)
    corpus = load_corpus(spec)
    heldout = [s for i, s in enumerate(corpus.sentences) if i % 10 == 9]
    train_part = [s for i, s in enumerate(corpus.sentences) if i % 10 != 9]
    if not heldout or not train_part:
        raise InputError(f"corpus {spec!r} has {len(corpus)} sentences; training needs at least 10 (every tenth is held out)")
    return (Corpus(f"{corpus.name}-train", train_part, corpus.pretokenized, corpus.source),
            Corpus(f"{corpus.name}-heldout", heldout, corpus.pretokenized, corpus.source))


class _Encoded:
    """Sentences as word-type indexes (type 0 = <S>, 1 = </S>, last = padding), with each type's
    character ids and softmax id, so a batch is two table lookups."""

    def __init__(self, sentences: Sequence[Sequence[str]], vocab: Sequence[str], max_characters: int) -> None:
        index = {word: i for i, word in enumerate(vocab)}
        types: dict[str, int] = {}
        rows = []
        for sentence in sentences:
            rows.append(np.array([0, *(types.setdefault(w, len(types) + 2) for w in sentence), 1], dtype=np.int64))
        self.sentences = rows
        self.pad = len(types) + 2
        chars = np.zeros((self.pad + 1, max_characters), dtype=np.int64)
        chars[0], chars[1] = bos_ids(max_characters), eos_ids(max_characters)
        targets = np.full(self.pad + 1, -1, dtype=np.int64)
        targets[0], targets[1] = index[BOS_TOKEN], index[EOS_TOKEN]
        for word, t in types.items():
            chars[t] = word_ids(word, max_characters)
            targets[t] = index.get(word, index[UNK_TOKEN])
        self.chars = torch.from_numpy(chars)
        self.targets = torch.from_numpy(targets)
        self.lengths = np.array([len(r) for r in rows], dtype=np.int64)

    def batch(self, indexes: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
        longest = int(self.lengths[list(indexes)].max())
        types = np.full((len(indexes), longest), self.pad, dtype=np.int64)
        for row, i in enumerate(indexes):
            types[row, : self.lengths[i]] = self.sentences[i]
        t = torch.from_numpy(types)
        return self.chars[t], self.targets[t], int(self.lengths[list(indexes)].sum() - 2 * len(indexes))

    def batches(self, batch_tokens: int, rng: np.random.Generator | None) -> list[list[int]]:
        """Batches of similar length (at most `batch_tokens` padded tokens, at least one sentence);
        shuffled with `rng` (pools of 100 batches sorted by length, batch order shuffled)."""
        order = rng.permutation(len(self.sentences)) if rng is not None else np.arange(len(self.sentences))
        pool = max(1, 100 * batch_tokens // max(1, int(self.lengths.mean())))
        batches: list[list[int]] = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool].tolist(), key=lambda i: (self.lengths[i], i))
            batch: list[int] = []
            for i in chunk:
                if batch and (len(batch) + 1) * self.lengths[i] > batch_tokens:
                    batches.append(batch)
                    batch = []
                batch.append(i)
            if batch:
                batches.append(batch)
        if rng is not None:
            batches = [batches[k] for k in rng.permutation(len(batches))]
        return batches


@torch.inference_mode()
def perplexity(model: ElmoBiLM, sentences: Sequence[Sequence[str]], *, batch_tokens: int = 4000) -> Perplexity:
    """Forward, backward and average perplexity of `sentences` under the model's full softmax
    (stateless, no dropout); unknown words count as `<UNK>` predictions."""
    if model.softmax is None:
        raise InputError("this biLM has no softmax (published weight files ship none); it cannot score text")
    missing = [t for t in (BOS_TOKEN, EOS_TOKEN, UNK_TOKEN) if t not in model.vocab]
    if missing:
        raise InputError(f"the softmax vocabulary lacks {missing}; scoring needs <S>, </S> and {UNK_TOKEN} in it")
    if not sentences:
        raise InputError("no sentences to score")
    was_training = model.training
    model.eval()
    data = _Encoded(sentences, model.vocab, model.config.max_characters_per_token)
    forward = backward = 0.0
    n = 0
    try:
        for indexes in data.batches(batch_tokens, None):
            chars, targets, _ = data.batch(indexes)
            f, b, count = model.lm_losses(model(chars.to(model.device)), targets)
            forward, backward, n = forward + float(f), backward + float(b), n + count
    finally:
        model.train(was_training)
    known = set(model.vocab)
    words = [w for s in sentences for w in s]
    oov = sum(w not in known for w in words) / max(1, len(words))
    return Perplexity(math.exp(forward / n), math.exp(backward / n), math.exp((forward + backward) / (2 * n)), n, oov)


def _corpus_words(corpus: Corpus) -> list[list[str]]:
    return [[w.text for w in sentence.words] for sentence in corpus.sentences]


def train(
    out: str | Path,
    *,
    corpus: str | tuple[Corpus, Corpus] = "brown",
    config: TrainConfig = TrainConfig(),
    device: str = "auto",
    overwrite: bool = False,
    max_steps: int | None = None,
    checkpoint_every: int = 200,
    threads: int | None = None,
    progress: Progress | None = None,
) -> TrainResult:
    """Train a biLM on `corpus` (a spec for `split_corpus`, or (train, held-out) corpora) into `out`.

    Re-running the same call resumes from the last checkpoint (a finished run is not repeated);
    a folder holding a run with another configuration or corpus is refused unless `overwrite`.
    `max_steps` stops after that many optimizer steps in all (checkpointed; the run resumes later).
    `threads` sets torch's CPU threads for the call (on a shared machine 1 can beat 2: spinning
    threads that wait for a busy core cost more than they give)."""
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _train(out, corpus=corpus, config=config, device=device, overwrite=overwrite, max_steps=max_steps,
                      checkpoint_every=checkpoint_every, progress=progress or NoProgress())
    finally:
        torch.set_num_threads(previous_threads)


_CHECKPOINT_KEYS = ("identity", "model", "optimizer", "epoch", "position", "step", "history", "rng")


def _load_checkpoint(path: Path) -> dict[str, Any]:
    """The training state saved at `path`; a damaged or foreign file is an error naming it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types (RuntimeError, UnpicklingError, EOFError) for a bad file
        problem = f"{type(error).__name__}: {error}".splitlines()[0]
        state = None
    else:
        problem = "it is not an lmgeom training checkpoint"
    if not isinstance(state, dict) or any(key not in state for key in _CHECKPOINT_KEYS):
        raise InputError(f"the checkpoint {path} cannot be read ({problem}); delete it to train from the start, "
                         "or pass `overwrite=True`", param="overwrite")
    return state


def _train(
    out: str | Path, *, corpus: str | tuple[Corpus, Corpus], config: TrainConfig, device: str, overwrite: bool,
    max_steps: int | None, checkpoint_every: int, progress: Progress,
) -> TrainResult:
    out = require_writable(out)  # before hours of training, not after
    resolved = resolve_device(device)
    train_corpus, heldout_corpus = split_corpus(corpus) if isinstance(corpus, str) else corpus
    identity = {"config": dataclasses.asdict(config), "train_fingerprint": train_corpus.fingerprint,
                "heldout_fingerprint": heldout_corpus.fingerprint}
    checkpoint_path = out / CHECKPOINT_FILE
    state: dict[str, Any] | None = None
    if checkpoint_path.exists():
        if overwrite:
            for name in (CHECKPOINT_FILE, OPTIONS_FILE, WEIGHTS_FILE, REPORT_FILE):
                (out / name).unlink(missing_ok=True)
        else:
            state = _load_checkpoint(checkpoint_path)
            if state["identity"] != identity:
                changed = sorted(k for k in identity if state["identity"].get(k) != identity[k])
                raise InputError(f"{out} holds a training run with another {', '.join(changed)}; pass `overwrite=True` or choose another `out`",
                                 param=("overwrite", "out"))
            report_path = out / REPORT_FILE
            if state["epoch"] >= config.epochs and report_path.exists() and (out / WEIGHTS_FILE).exists():
                report = json.loads(report_path.read_text(encoding="utf-8"))
                return TrainResult(out, True, report["steps"], Perplexity(**report["heldout_perplexity"]),
                                   report["words_per_second_this_run"])

    torch.manual_seed(config.seed)
    train_words = _corpus_words(train_corpus)
    vocab = build_vocab(train_words, config.vocab_size)
    model = ElmoBiLM(config.model_config(len(vocab)), vocab=vocab).to(resolved)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.learning_rate)
    data = _Encoded(train_words, vocab, model.config.max_characters_per_token)
    epoch_batches = [data.batches(config.batch_tokens, np.random.default_rng([config.seed, e])) for e in range(config.epochs)]
    total_steps = sum(len(b) for b in epoch_batches)
    epoch, position, step, history = 0, 0, 0, []
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, position, step, history = state["epoch"], state["position"], state["step"], state["history"]
        torch.set_rng_state(state["rng"])
        if resolved.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], resolved)

    def save_checkpoint() -> None:
        payload = {
            "identity": identity, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "epoch": epoch, "position": position, "step": step, "history": history, "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(resolved) if resolved.type == "cuda" else None,
        }
        atomic_write(checkpoint_path, lambda tmp: torch.save(payload, tmp))

    started, words_seen, stopped = time.perf_counter(), 0, False
    stage = f"train ELMo on {train_corpus.name}"
    progress.start(stage, total_steps, unit="steps")
    progress.advance(stage, step, note="resumed" if step else "")
    model.train()
    while epoch < config.epochs and not stopped:
        batches = epoch_batches[epoch]
        while position < len(batches):
            if max_steps is not None and step >= max_steps:
                stopped = True
                break
            chars, targets, n_words = data.batch(batches[position])
            with ieee_float32():  # the gradients' convolutions and LSTMs too, as on the CPU
                forward_nll, backward_nll, n = model.lm_losses(
                    model(chars.to(resolved)), targets, n_negative_samples=config.n_negative_samples
                )
                loss = (forward_nll + backward_nll) / (2 * n)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            position, step, words_seen = position + 1, step + 1, words_seen + n_words
            elapsed = max(time.perf_counter() - started, 1e-9)
            progress.advance(stage, note=f"epoch {epoch + 1} loss {loss.item():.3f} {words_seen / elapsed:,.0f} words/s")
            if step % checkpoint_every == 0:
                save_checkpoint()
        if not stopped:
            history.append({"epoch": epoch, "step": step})
            epoch, position = epoch + 1, 0
    save_checkpoint()
    elapsed = time.perf_counter() - started
    speed = words_seen / elapsed if elapsed > 0 and words_seen else 0.0
    model.eval()
    heldout = perplexity(model, _corpus_words(heldout_corpus))
    save_elmo(model, out / OPTIONS_FILE, out / WEIGHTS_FILE)
    report = {
        "complete": not stopped, "steps": step, "total_steps": total_steps, "epochs_done": epoch,
        "config": dataclasses.asdict(config), "device": str(resolved), "torch_threads": torch.get_num_threads(),
        "n_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "train": {"corpus": train_corpus.name, "sentences": len(train_corpus), "words": train_corpus.n_words,
                  "fingerprint": train_corpus.fingerprint},
        "heldout": {"corpus": heldout_corpus.name, "sentences": len(heldout_corpus), "words": heldout_corpus.n_words,
                    "fingerprint": heldout_corpus.fingerprint},
        "words_per_second_this_run": speed,
        "heldout_perplexity": dataclasses.asdict(heldout),
        "perplexity_note": "one prediction per word plus </S> (forward) or <S> (backward) per sentence; "
                           "words outside the softmax vocabulary are scored as the single <UNK> class",
    }
    atomic_write_text(out / REPORT_FILE, json.dumps(report, indent=2) + "\n")
    return TrainResult(out, not stopped, step, heldout, speed)

