"""The logit lens of a decoder: every layer's hidden state read out through the model's final norm and
its unembedding, as the next-token distribution that layer would predict.

For each layer l (0 = embedding output ... L) and each position t of a sentence that has a next token
t + 1 in the same sentence:

- `normed` is hidden state l through the model's final norm (`encoders.hf.final_norm`: `ln_f` in
  GPT-2, `norm` in Llama, SmolLM2 and Gemma 3). Hugging Face returns the last hidden state already
  after the final norm in these models (`HFEncoder.last_layer`, position "after final norm"), so layer
  L is taken as it is and the norm is applied to layers 0 ... L - 1 only; a model whose last hidden
  state is the norm's input ("before final norm") has it applied to every layer, one without a final
  norm to none, and one where it cannot be told ("unknown") is refused.
- logits = normed @ W_U^T (+ the head's bias, if any), W_U the tied input embedding matrix
  (`get_input_embeddings().weight`) for models with `tie_word_embeddings`, else the LM head's weight;
  a model with `final_logit_softcapping` has its logits capped as its LM head caps them (c * tanh(z / c)).
- p_l = softmax(logits); the entropy H(p_l) and KL(p_l || p_L) in nats, and the rank of the actual
  next token among all vocabulary entries (0 = the top; ties with other entries count as below it).

The vocabulary is read in chunks (softmax sums kept as running maxima and rescaled sums, in float64),
so memory is bounded by `LensOptions.max_chunk_mb` whatever the vocabulary (Gemma 3: 262,144 entries).
Sentences longer than the model's window are cut at its end (`counts.n_truncated` says how many).
The per-token values go to `lens.parquet` (one row per token position and layer) and the per-layer
summary with the settings to `lens.json`, through `lmgeom.rundir`.
"""

from __future__ import annotations

import io
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from lmgeom import rundir
from lmgeom.errors import InputError
from lmgeom.progress import NoProgress, Progress

if TYPE_CHECKING:
    import torch

    from lmgeom.corpus import Sentence
    from lmgeom.encoders.hf import HFEncoder

LENS_COLUMNS = ("sentence_id", "position", "token_id", "next_token_id", "word_index", "is_last_piece", "store_row",
                "layer", "entropy", "kl", "rank")
"""The columns of `lens.parquet`: one row per (token position, layer). `position` is the piece's index
in the tokenized sentence (special tokens included), predicting piece `position + 1`
(`next_token_id`); `word_index` the corpus word the piece belongs to (-1: a special token),
`is_last_piece` whether it is that word's last piece (its prediction is of the next word's first
piece); `store_row` the row of that word in the run's store (-1: no store of the same model and corpus,
or the word has no row of its own there)."""


@dataclass(frozen=True)
class LensOptions:
    """How the logit lens is computed.

    `limit` keeps the corpus's first sentences; `batch_sentences` sentences run through the model at
    once; `max_chunk_mb` bounds the float64 logits of one vocabulary chunk over every layer of a batch;
    `device` is where the model runs (auto, cpu, cuda, cuda:N); `compute_dtype` the model's dtype
    (None: float32, which the lens's check needs)."""

    limit: int | None = None
    batch_sentences: int = 16
    max_chunk_mb: int = 256
    device: str = "auto"
    compute_dtype: str | None = "float32"

    def __post_init__(self) -> None:
        for name in ("batch_sentences", "max_chunk_mb"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"`{name}` must be at least 1; got {getattr(self, name)}", param=name)
        if self.limit is not None and int(self.limit) < 1:
            raise InputError(f"`limit` must be a number of sentences, at least 1, or None for all; got {self.limit}",
                             param="limit")

    def to_settings(self) -> dict[str, Any]:
        """The settings lens.json records (the device only says where, not what was computed)."""
        return {key: value for key, value in asdict(self).items() if key not in ("device", "batch_sentences", "max_chunk_mb")}


@dataclass(frozen=True)
class LensReadout:
    """How hidden states become logits: the final norm (None: none), whether it applies to the last
    layer, the unembedding (vocab x dim) with its bias, the softcap, and what each is, in words."""

    norm: Any
    norm_last: bool
    weight: Any
    bias: Any
    softcap: float | None
    description: dict[str, Any]


def readout_of(encoder: HFEncoder, *, weight: Any = None, bias: Any = None) -> LensReadout:
    """The readout of the logit lens for a loaded decoder.

    Parameters
    ----------
    encoder : HFEncoder
        The loaded model (an `AutoModel` without its LM head) and what its last layer is (`last_layer`).
    weight, bias : torch.Tensor, optional
        The unembedding (vocab x dim) and its bias, when the model's own are not reachable from the
        loaded model (an untied model whose LM head was not loaded). By default the tied input
        embeddings, or the model's output embeddings.

    Returns
    -------
    LensReadout
        The final norm, whether it is applied to the last layer, the unembedding and the softcap.

    Raises
    ------
    InputError
        For a model whose last layer cannot be placed relative to its final norm, or an untied model
        without an LM head and no `weight` given.
    """
    from lmgeom.encoders.hf import final_norm

    model: Any = encoder.model
    config: Any = model.config
    position = encoder.last_layer["position"]
    if position == "unknown":
        raise InputError(f"{encoder.model_id}: the logit lens needs to know whether the last hidden state is before or after "
                         f"the final norm, but here: {encoder.last_layer['why']}; give a model whose final norm is one of "
                         "the usual modules (ln_f, norm, final_layer_norm)", param="model")
    found = final_norm(model) if position != "no final norm" else None
    norm_name, norm = found if found is not None else (None, None)
    source = "given"
    if weight is None:
        tied = bool(getattr(config, "tie_word_embeddings", False))
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if tied:
            weight, source = model.get_input_embeddings().weight, "tied input embeddings (get_input_embeddings().weight)"
        elif head is not None:
            weight, bias, source = head.weight, getattr(head, "bias", None), "the LM head (get_output_embeddings())"
        else:
            raise InputError(f"{encoder.model_id} does not tie its output embeddings to its input embeddings "
                             "(tie_word_embeddings is false) and the loaded model has no LM head; give the unembedding as "
                             "`weight` (the LM head's weight, vocab x dim), or a model with tied embeddings", param="weight")
    softcap = getattr(config, "final_logit_softcapping", None)
    description = {
        "final_norm": norm_name,
        "final_norm_applied_to": ("layers 0..L-1 (layer L is already after it)" if norm is not None and position == "after final norm"
                                  else "every layer" if norm is not None else "no layer (the model has no final norm)"),
        "last_layer": encoder.last_layer,
        "unembedding": source,
        "unembedding_shape": [int(x) for x in weight.shape],
        "bias": bias is not None,
        "softcap": softcap,
    }
    return LensReadout(norm, position == "before final norm", weight, bias, float(softcap) if softcap else None, description)


def require_causal(encoder: HFEncoder) -> None:
    """Refuse a model that is not a causal decoder: the logit lens reads a next-token prediction at each
    position, which only a model that sees no later token makes. Told by one forward pass: changing
    the last token of a short input must leave every earlier position's last hidden state as it is.

    Raises
    ------
    InputError
        For an encoder (BERT, MiniLM, ...), naming the model and why.
    """
    import torch

    model: Any = encoder.model
    ids = list(encoder.tokenizer("The bank of the river.")["input_ids"])
    other = list(ids)
    other[-1] = (ids[-1] + 1) % int(model.config.vocab_size)
    with torch.inference_mode():
        batch = torch.tensor([ids, other], device=encoder.device)
        last = model(input_ids=batch, output_hidden_states=True, use_cache=False).hidden_states[-1]
    if not torch.allclose(last[0, :-1], last[1, :-1], rtol=0, atol=1e-6):
        raise InputError(f"{encoder.model_id} is not a causal decoder ({type(encoder.model).__name__}: its earlier positions "
                         "change when a later token does, so a position's vector is no next-token prediction); the logit "
                         "lens applies to decoders (tiny-gpt2, tiny-llama, smollm2, gemma3, ...)", param="model")


def lens_values(hidden_states: Sequence[torch.Tensor], targets: torch.Tensor, readout: LensReadout, *,
                max_chunk_mb: int = 256) -> dict[str, np.ndarray]:
    """Entropy, KL to the last layer and rank of the target for rows of hidden states, every layer.

    Parameters
    ----------
    hidden_states : sequence of torch.Tensor
        Layer 0 ... L, each (n, dim): the rows to read out (the same positions in every layer).
    targets : torch.Tensor
        (n,) the id of each row's actual next token.
    readout : LensReadout
        The final norm, unembedding and softcap (`readout_of`).
    max_chunk_mb : int
        Bound on one vocabulary chunk's float64 logits over every layer.

    Returns
    -------
    dict of numpy.ndarray
        `entropy` and `kl` (nats, float64) and `rank` (int64), each (L + 1, n).
    """
    import torch

    last = len(hidden_states) - 1
    weight = readout.weight
    with torch.inference_mode():
        rows = []
        for layer, h in enumerate(hidden_states):
            if readout.norm is not None and (layer < last or readout.norm_last):
                h = readout.norm(h)
            rows.append(h.to(weight.dtype))
        z = torch.stack(rows)  # (K, n, d)
        n_layers, n = z.shape[0], z.shape[1]
        vocab = int(weight.shape[0])

        def logits(w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            out = torch.matmul(z, w.T).double()
            if b is not None:
                out = out + b.double()
            if readout.softcap:
                out = torch.tanh(out / readout.softcap) * readout.softcap
            return out

        target_w = weight[targets]  # (n, d)
        true = (z * target_w).sum(-1).double()
        if readout.bias is not None:
            true = true + readout.bias[targets].double()
        if readout.softcap:
            true = torch.tanh(true / readout.softcap) * readout.softcap
        shape = (n_layers, n)
        m = torch.full(shape, -torch.inf, dtype=torch.float64, device=z.device)
        s = torch.zeros(shape, dtype=torch.float64, device=z.device)
        s_own = torch.zeros_like(s)  # sum of e * (z - m): E_p[z] - m, rescaled with m
        s_last = torch.zeros_like(s)  # sum of e * z_L, rescaled with m
        rank = torch.zeros(shape, dtype=torch.int64, device=z.device)
        step = max(256, int(max_chunk_mb) * 2**20 // (8 * 3 * n_layers * max(n, 1)))
        for start in range(0, vocab, step):
            stop = min(vocab, start + step)
            chunk = logits(weight[start:stop], None if readout.bias is None else readout.bias[start:stop])  # (K, n, c)
            above = chunk > true[..., None]
            inside = (targets >= start) & (targets < stop)
            if bool(inside.any()):  # the target itself is never above itself, whatever the rounding of its two products
                index = torch.nonzero(inside).squeeze(1)
                above[:, index, targets[index] - start] = False
            rank += above.sum(-1)
            new_m = torch.maximum(m, chunk.max(-1).values)
            scale = torch.exp(m - new_m)
            e = torch.exp(chunk - new_m[..., None])
            s_own = (s_own + (m - new_m).nan_to_num(0.0) * s) * scale + (e * (chunk - new_m[..., None])).sum(-1)
            s = s * scale + e.sum(-1)
            s_last = s_last * scale + (e * chunk[last]).sum(-1)
            m = new_m
        log_z = m + torch.log(s)
        mean_z = m + s_own / s  # E_p[z]
        entropy = log_z - mean_z
        kl = (mean_z - log_z) - (s_last / s - log_z[last])
    return {"entropy": entropy.cpu().numpy(), "kl": kl.clamp_min(0.0).cpu().numpy(), "rank": rank.cpu().numpy()}


def _word_of_pieces(offsets: Sequence[tuple[int, int]], sentence: Sentence) -> np.ndarray:
    """The corpus word each piece overlaps first (-1 for a piece of no characters: a special token)."""
    starts = np.array([w.start for w in sentence.words], dtype=np.int64)
    ends = np.array([w.end for w in sentence.words], dtype=np.int64)
    out = np.full(len(offsets), -1, dtype=np.int64)
    for i, (a, b) in enumerate(offsets):
        if b > a:
            hit = np.flatnonzero((starts < b) & (ends > a))
            if hit.size:
                out[i] = hit[0]
    return out


def pad_batch(ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id lists as one right-padded batch: (input_ids, attention_mask), each (n, longest)."""
    import torch

    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for row, x in enumerate(ids):
        input_ids[row, : len(x)] = torch.tensor(list(x), dtype=torch.long)
        mask[row, : len(x)] = 1
    return input_ids, mask


def lens_table(encoder: HFEncoder, sentences: Sequence[Sentence], *, readout: LensReadout | None = None,
               options: LensOptions | None = None, first_rows: np.ndarray | None = None,
               progress: Progress | None = None, stage: str = "lens") -> tuple[pd.DataFrame, dict[str, int]]:
    """The logit lens of every sentence, as the rows of `lens.parquet` (`LENS_COLUMNS`).

    Parameters
    ----------
    encoder : HFEncoder
        A causal decoder (`require_causal`), loaded in the dtype to compute in.
    sentences : sequence of Sentence
        The corpus's sentences; each is tokenized as the encoder tokenizes it (its defaults, special
        tokens included) and cut at the model's window.
    readout : LensReadout, optional
        Defaults to `readout_of(encoder)`.
    options : LensOptions, optional
        Batch size and the vocabulary chunk's memory bound.
    first_rows : numpy.ndarray, optional
        Each sentence's first row in a store of the same model and corpus whose rows are exactly the
        corpus words (no special tokens): fills `store_row`.
    progress : Progress, optional
        Told of each batch of sentences, as the stage `stage`.
    stage : str
        The stage's name for `progress`.

    Returns
    -------
    (pandas.DataFrame, dict)
        The table, and counts (`n_sentences`, `n_positions`, `n_truncated`, `n_without_next`).
    """
    import torch

    options = options or LensOptions()
    readout = readout or readout_of(encoder)
    progress = progress or NoProgress()
    tokenizer, device = encoder.tokenizer, encoder.device
    encoded = tokenizer([s.text for s in sentences], return_offsets_mapping=True, truncation=False)
    parts: list[pd.DataFrame] = []
    counts = {"n_sentences": len(sentences), "n_positions": 0, "n_truncated": 0, "n_without_next": 0}
    batch = int(options.batch_sentences)
    progress.start(stage, len(sentences), unit="sentences")
    for begin in range(0, len(sentences), batch):
        ids = [list(x)[: encoder.max_length] for x in encoded["input_ids"][begin:begin + batch]]
        counts["n_truncated"] += sum(len(x) > encoder.max_length for x in encoded["input_ids"][begin:begin + batch])
        input_ids, mask = pad_batch(ids, encoder.pad_id)
        with torch.inference_mode():
            out = encoder.model(input_ids=input_ids.to(device), attention_mask=mask.to(device), output_hidden_states=True,
                                use_cache=False)
        has_next = torch.zeros_like(mask, dtype=torch.bool)
        has_next[:, :-1] = (mask[:, 1:] == 1) & (mask[:, :-1] == 1)
        counts["n_without_next"] += sum(len(x) < 2 for x in ids)
        b_index, t_index = torch.nonzero(has_next, as_tuple=True)
        if b_index.numel():
            targets = input_ids[b_index, t_index + 1].to(device)
            states = [h[b_index.to(device), t_index.to(device)] for h in out.hidden_states]
            values = lens_values(states, targets, readout, max_chunk_mb=options.max_chunk_mb)
            sentence_id = (b_index.numpy() + begin).astype(np.int64)
            position = t_index.numpy().astype(np.int32)
            words = [_word_of_pieces(encoded["offset_mapping"][begin + b][: len(ids[b])], sentences[begin + b])
                     for b in range(len(ids))]
            word_index = np.array([words[b][t] for b, t in zip(b_index.tolist(), t_index.tolist())], dtype=np.int64)
            last_piece = np.array([words[b][t] >= 0 and (t + 1 >= len(words[b]) or words[b][t + 1] != words[b][t])
                                   for b, t in zip(b_index.tolist(), t_index.tolist())], dtype=bool)
            store_row = (np.where((word_index >= 0) & (first_rows[sentence_id] >= 0), first_rows[sentence_id] + word_index, -1)
                         if first_rows is not None
                         else np.full(len(sentence_id), -1, dtype=np.int64))
            n_layers, n = values["entropy"].shape
            parts.append(pd.DataFrame({
                "sentence_id": np.tile(sentence_id, n_layers), "position": np.tile(position, n_layers),
                "token_id": np.tile(input_ids[b_index, t_index].numpy().astype(np.int64), n_layers),
                "next_token_id": np.tile(targets.cpu().numpy().astype(np.int64), n_layers),
                "word_index": np.tile(word_index, n_layers).astype(np.int32),
                "is_last_piece": np.tile(last_piece, n_layers),
                "store_row": np.tile(store_row, n_layers).astype(np.int64),
                "layer": np.repeat(np.arange(n_layers, dtype=np.int16), n),
                "entropy": values["entropy"].reshape(-1), "kl": values["kl"].reshape(-1),
                "rank": values["rank"].reshape(-1).astype(np.int64),
            }))
            counts["n_positions"] += n
        progress.advance(stage, len(ids))
    table = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in LENS_COLUMNS})
    return table[list(LENS_COLUMNS)], counts


def layer_summary(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Per layer: the mean and median entropy and KL (nats), the mean and median rank, the share of
    positions whose next token is the top one (`top1`), and the number of positions."""
    records = []
    for layer, group in table.groupby("layer", sort=True):
        records.append({"layer": int(layer), "layer_name": rundir.layer_name(int(layer)), "n": int(len(group)),
                        "entropy_mean": float(group["entropy"].mean()), "entropy_median": float(group["entropy"].median()),
                        "kl_mean": float(group["kl"].mean()), "kl_median": float(group["kl"].median()),
                        "rank_mean": float(group["rank"].mean()), "rank_median": float(group["rank"].median()),
                        "top1": float((group["rank"] == 0).mean())})
    return records


@dataclass
class LensResult:
    """What `run_lens` computed: the per-layer summary, the counts, the table, the files written."""

    model_id: str
    layers: list[dict[str, Any]]
    counts: dict[str, int]
    table: pd.DataFrame
    paths: list[Any]
    seconds: float


def _store_rows(out: Path, encoder: HFEncoder, corpus: Any) -> tuple[dict[str, Any] | None, np.ndarray | None]:
    """The run's store meta and each sentence's first row when the run holds a store of this model and
    corpus whose rows are the corpus words; (None, None) when it holds no store; a store of another model
    or corpus is refused."""
    meta = rundir.read_store_meta(out)
    if not meta:
        return None, None
    same = meta.get("model_fingerprint") == encoder.model_fingerprint and meta.get("corpus_fingerprint") == corpus.fingerprint
    if not same:
        raise InputError(f"{out} holds a store of {meta.get('model_id')} on corpus {meta.get('corpus_name')} "
                         f"({meta.get('corpus_fingerprint', '')[:12]}), not of {encoder.model_id} on {corpus.name} "
                         f"({corpus.fingerprint[:12]}); write the lens to a run of its own with `out`", param="out")
    from lmgeom.store import RepresentationStore

    sentences = RepresentationStore.open(out).sentences
    words = np.array([len(s.words) for s in corpus.sentences], dtype=np.int64)
    first = sentences["first_row"].to_numpy().astype(np.int64)
    aligned = sentences["n_tokens"].to_numpy() == words
    return meta, np.where(aligned, first, -1)  # a sentence whose rows are not its words gets no store rows (-1)


def run_lens(model: str, corpus: str, out: Path | str, options: LensOptions | None = None, *,
             progress: Progress | None = None) -> LensResult:
    """The logit lens of a decoder over a corpus, written to `out`/lens.parquet and `out`/lens.json.

    Parameters
    ----------
    model : str
        A named decoder (tiny-gpt2, smollm2, gemma3, ...), a Hugging Face id or a local folder.
    corpus : str
        A corpus spec (`lmgeom.corpus.load_corpus`), cut to `options.limit` sentences.
    out : path
        The run directory; where it holds a store of the same model and corpus, each token's word row
        there is recorded (`store_row`), and a store of another model or corpus is refused.
    options : LensOptions, optional
        The sentences, batch size, memory bound, device and dtype.
    progress : Progress, optional
        Told of each batch.

    Returns
    -------
    LensResult
        The per-layer summary, counts, table and the files written.
    """
    from lmgeom.corpus import load_corpus
    from lmgeom.encoders.registry import load_encoder

    options = options or LensOptions()
    progress = progress or NoProgress()
    started = time.perf_counter()
    sentences = load_corpus(corpus, limit=options.limit)
    encoder: Any = load_encoder(model, device=options.device, compute_dtype=options.compute_dtype)
    if not hasattr(encoder, "tokenizer"):
        raise InputError(f"{model} is not a transformers decoder; the logit lens reads a causal language model's "
                         "hidden states through its final norm and unembedding", param="model")
    require_causal(encoder)
    out = Path(out)
    store_meta, first_rows = _store_rows(out, encoder, sentences) if out.exists() else (None, None)
    readout = readout_of(encoder)
    table, counts = lens_table(encoder, sentences.sentences, readout=readout, options=options, first_rows=first_rows,
                               progress=progress, stage=f"lens {sentences.name}")
    seconds = time.perf_counter() - started
    layers = layer_summary(table)
    settings = {**options.to_settings(), "model_id": encoder.model_id, "model_fingerprint": encoder.model_fingerprint,
                "corpus": corpus, "corpus_name": sentences.name, "corpus_fingerprint": sentences.fingerprint}
    meta = store_meta or {"model_id": encoder.model_id, "corpus_fingerprint": sentences.fingerprint}
    buffer = io.BytesIO()
    table.to_parquet(buffer, index=False)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"settings": settings, "readout": readout.description, "store_joined": first_rows is not None,
               "counts": {**counts, "n_layers": len(layers), "vocab_size": readout.description["unembedding_shape"][0]},
               "seconds": round(seconds, 2), "device": str(encoder.device), "layers": layers,
               "definitions": {"entropy": "entropy of the layer's next-token distribution, nats",
                               "kl": "KL(p_layer || p_last), nats",
                               "rank": "rank of the actual next token among the vocabulary, 0 = top",
                               "top1": "share of positions whose actual next token is the layer's top one"}}
    paths = rundir.write_result_set(rundir.LENS.at(out), rundir.LENS.kind, payload, store_meta=meta, settings=settings,
                                    companions=[(rundir.LENS_TABLE.at(out), buffer.getvalue())])
    return LensResult(encoder.model_id, layers, counts, table, paths, seconds)


def spearman_by_sentence(x: np.ndarray, y: np.ndarray, groups: np.ndarray, *, n_boot: int = 1000, seed: int = 0,
                         confidence: float = 0.95) -> dict[str, Any]:
    """Spearman's rho of paired values with a percentile bootstrap interval over groups (sentences).

    Parameters
    ----------
    x, y : numpy.ndarray
        The paired values (non-finite pairs are left out).
    groups : numpy.ndarray
        Each pair's group (its sentence): a resample draws whole groups with replacement, since the
        tokens of one sentence are not independent.
    n_boot : int
        Bootstrap resamples (0: no interval).
    seed : int
        Seed of the resampling.
    confidence : float
        Level of the interval.

    Returns
    -------
    dict
        `rho`, `low`, `high` (NaN without an interval), `n` (pairs), `n_groups` and `n_boot`.
    """
    from scipy import stats as scipy_stats

    keep = np.isfinite(x) & np.isfinite(y)
    x, y, groups = np.asarray(x, np.float64)[keep], np.asarray(y, np.float64)[keep], np.asarray(groups)[keep]
    labels, index = np.unique(groups, return_inverse=True)
    out: dict[str, Any] = {"rho": float("nan"), "low": float("nan"), "high": float("nan"), "n": int(len(x)),
                           "n_groups": int(len(labels)), "n_boot": int(n_boot)}
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    out["rho"] = float(scipy_stats.spearmanr(x, y).statistic)
    order = np.argsort(index, kind="stable")
    starts = np.searchsorted(index[order], np.arange(len(labels) + 1))
    members = [order[starts[g]:starts[g + 1]] for g in range(len(labels))]
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(int(n_boot)):
        rows = np.concatenate([members[g] for g in rng.integers(0, len(labels), size=len(labels))])
        if len(rows) >= 3 and np.ptp(x[rows]) > 0 and np.ptp(y[rows]) > 0:
            draws.append(scipy_stats.spearmanr(x[rows], y[rows]).statistic)
    if draws:
        tail = (1 - confidence) / 2
        out["low"], out["high"] = (float(v) for v in np.quantile(draws, [tail, 1 - tail]))
    return out


def lens_joinable(run: Any) -> bool:
    """Whether `run` is a local run directory whose lens can be joined (`join_lens`): a lens.json computed
    with the run's store present, and the store's contextuality_words.csv."""
    if not isinstance(run, (str, Path)) or "://" in str(run) or not Path(run).is_dir():
        return False
    try:
        document = rundir.read_result(Path(run), rundir.LENS)
    except (rundir.ResultFileError, InputError):  # a stale or foreign lens is refused where it is read; here it is not joined
        return False
    return bool(document and document.get("store_joined")) and rundir.read_words(Path(run)) is not None


def join_lens(run: Path | str, *, geometry: Path | str | None = None, n_boot: int = 1000, seed: int = 0,
              confidence: float = 0.95) -> dict[str, Any]:
    """The lens joined to the run's contextuality and geometry, written to `run`/lens_join.json.

    Per layer, Spearman's rho between each word occurrence's lens values at its last piece (entropy,
    and the rank of the next token) and the self-similarity of its word at that layer
    (contextuality_words.csv), with a bootstrap interval over sentences. Across layers, Spearman's rho
    between the layer-mean entropy and the layer's TwoNN intrinsic dimension (geometry.json of the run,
    or `geometry`), with a bootstrap interval over layers: n is L + 1 layers, so it is wide.

    Parameters
    ----------
    run : path
        A run holding lens.json and lens.parquet written with a store of the same model and corpus
        (their `store_row`), and that store's contextuality_words.csv (`lmgeom analyze`).
    geometry : path, optional
        A geometry.json to take the intrinsic dimension from when the run has none (of another store of
        the model: its `store_generation` and sentence count are recorded beside the result).
    n_boot, seed, confidence : int, int, float
        The bootstrap's resamples, seed and level.

    Returns
    -------
    dict
        The document written (`by_layer`, `across_layers`, `settings`).

    Raises
    ------
    InputError
        When the lens has no store rows (computed without the store) or the run has no
        contextuality_words.csv.
    """
    from lmgeom.store import RepresentationStore

    run = Path(run)
    document = rundir.read_result(run, rundir.LENS)
    if document is None:
        raise InputError(f"{run} holds no lens.json; compute it first (lmgeom lens MODEL --out {run.name})", param="run")
    table = pd.read_parquet(rundir.LENS_TABLE.at(run))
    words = rundir.read_words(run)
    if not document.get("store_joined") or words is None:
        raise InputError(f"{run}: the join needs the lens computed with the run's store present (store rows) and that "
                         "store's contextuality_words.csv; extract the store, analyze it, then compute the lens into the "
                         "same run", param="run")
    store = RepresentationStore.open(run)
    vocabulary = store.tokens["word"].to_numpy()
    table = table[(table["store_row"] >= 0) & table["is_last_piece"]].copy()
    table["word"] = vocabulary[table["store_row"].to_numpy()]
    self_sim = words[["word", "layer", "self_similarity"]].dropna()
    joined = table.merge(self_sim, on=["word", "layer"], how="inner")
    by_layer = []
    for layer, group in joined.groupby("layer", sort=True):
        entry: dict[str, Any] = {"layer": int(layer), "n_words": int(group["word"].nunique())}
        for key in ("entropy", "rank"):
            entry[key] = spearman_by_sentence(group[key].to_numpy(np.float64), group["self_similarity"].to_numpy(),
                                              group["sentence_id"].to_numpy(), n_boot=n_boot, seed=seed + int(layer),
                                              confidence=confidence)
        by_layer.append(entry)
    across: dict[str, Any] | None = None
    source = rundir.GEOMETRY.at(run) if geometry is None else Path(geometry)
    geometry_doc = (rundir.read_result(run, rundir.GEOMETRY) if geometry is None
                    else rundir.read_json(source, rundir.GEOMETRY.kind))
    if geometry_doc is not None:
        twonn = {int(layer["layer"]): next(e["dimension"] for e in layer["intrinsic_dimension"] if e["method"] == "twonn")
                 for layer in geometry_doc["layers"]}
        means = {int(r["layer"]): r["entropy_mean"] for r in document["layers"]}
        layers = sorted(set(twonn) & set(means))
        x, y = np.array([means[layer] for layer in layers]), np.array([twonn[layer] for layer in layers])
        across = {**spearman_by_sentence(x, y, np.arange(len(layers)), n_boot=n_boot, seed=seed, confidence=confidence),
                  "layers": layers, "geometry": "this run's geometry.json" if geometry is None else rundir.name_of(source),
                  "geometry_sentences": (geometry_doc.get("counts") or {}).get("sentences"),
                  "note": f"n = {len(layers)} layers: the interval resamples layers and is wide"}
    settings = {"n_boot": n_boot, "seed": seed, "confidence": confidence, "unit": "word occurrence at its last piece",
                "bootstrap_unit": "sentence", "lens_settings": document["settings"]}
    payload = {"settings": settings, "by_layer": by_layer, "across_layers": across,
               "counts": {"pairs": int(len(joined)), "sentences": int(joined["sentence_id"].nunique())}}
    rundir.write_result_set(rundir.LENS_JOIN.at(run), rundir.LENS_JOIN.kind, payload, store_meta=store.meta, settings=settings)
    return payload
