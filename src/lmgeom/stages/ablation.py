"""Ablations: what a model's rogue dimensions and massive activations do, measured by setting them to
zero or to their mean at one site of one layer and comparing with the same number of random
dimensions (`lmgeom ablate`).

Per (site, layer) an unablated pass over the corpus finds, at that site:

- the **rogue dimensions**: the `rogue_top_k` dimensions that contribute most to the average cosine
  (Timkey & van Schijndel 2021; `lmgeom.metrics.isotropy.rogue_dimensions`) over the corpus's pieces
  (special tokens left out, as the store leaves them out), or those of a run's geometry.json;
- the **outlier dimensions**: mean |h| more than 3 standard deviations above the mean over dimensions
  (`lmgeom.metrics.outliers.magnitude_outliers`);
- the **massive activations** (Sun et al. 2024): the (token, dimension) entries with |h| above
  `massive_min_magnitude` (100) and `massive_min_ratio` (1,000) times the layer's median |h|, over
  every position including special tokens.

Each ablation edits one (site, layer) in every forward pass (`lmgeom.encoders.ablation`): a set of
dimensions at every position, or the massive entries only (their token and dimension); `zero` sets
them to 0, `mean` to the dimension's mean over the entries ablated in the unablated pass (for
massive entries, the mean massive value: Sun et al.'s "set to their mean"). The control ablates the
same number of dimensions drawn at random from the others (seeded, `random_draws` draws): for
massive entries, the same tokens in as many random dimensions.

What is measured, each with a bootstrap interval of its change against the unablated model, and of
the change beyond the random control's mean:

- `loss` (decoders): the next-token cross-entropy of the corpus (nats per token), read out through the
  model's final norm and its unembedding (the tied input embeddings, as `lmgeom lens` reads them),
  beside a unigram model of the same tokens (the trivial baseline); intervals over sentences;
- `attention`: each later layer's attention share to the first position (mean over heads and later
  positions; eager attention), the sink that massive activations are tied to: the layers whose
  attention the edit can reach (`affected_attention_layers`), each and their mean;
- `sts`: STS-B Spearman x 100 of mean-pooled sentence vectors at the ablated layer and the last layer
  (one of them when the two are the same; intervals over pairs);
- `pos`: a linear probe's UPOS accuracy (UD English-EWT: trained on dev sentences, tested on test
  sentences; refitted on each ablation's vectors) at the ablated layer and the last layer, beside the
  most-frequent-tag baseline (intervals over test sentences).
"""

from __future__ import annotations

import io
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from lmgeom import rundir
from lmgeom.errors import InputError
from lmgeom.progress import NoProgress, Progress

if TYPE_CHECKING:
    import torch

    from lmgeom.encoders.hf import HFEncoder

DIM_KINDS = ("rogue", "outlier", "massive")
HOWS = ("zero", "mean")
MEASURES = ("loss", "attention", "sts", "pos")
ROGUE_TOP_K = 3


@dataclass(frozen=True)
class AblationOptions:
    """What `run_ablation` ablates and measures.

    `layers` (a `lmgeom.layerspec` spec over the model's layers, 0 = embedding output) and `sites`
    (`lmgeom.sitespec`) say where; `dims` is a sequence of kinds (`rogue`, `outlier`, `massive`) or
    explicit dimension lists ("507,247"); `how` zero and/or mean. `measures`: any of loss (decoders),
    attention, sts, pos; None = loss and attention for a decoder, sts, pos and attention for an
    encoder. `limit` corpus sentences; `sts_pairs` STS-B test pairs (seeded sample); `pos_train` and
    `pos_test` sentences of UD English-EWT's dev and test files. `random_draws` random-dimension
    controls per ablation; `n_boot` bootstrap resamples; `geometry` a run's geometry.json to take the
    rogue dimensions from (else found here); `data_dir` the data folder (None: LMGEOM_DATA, else
    ../shared/data)."""

    layers: str = "default"
    sites: str = "resid_post"
    dims: tuple[str, ...] = ("rogue", "massive")
    how: tuple[str, ...] = HOWS
    measures: tuple[str, ...] | None = None
    limit: int | None = 300
    sts_pairs: int = 500
    pos_train: int = 300
    pos_test: int = 300
    random_draws: int = 3
    n_boot: int = 1000
    seed: int = 0
    rogue_top_k: int = ROGUE_TOP_K
    massive_min_magnitude: float = 100.0
    massive_min_ratio: float = 1000.0
    geometry: str | None = None
    data_dir: str | None = None
    batch_sentences: int = 16
    device: str = "auto"
    compute_dtype: str | None = "float32"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("sts_pairs", "pos_train", "pos_test", "batch_sentences", "rogue_top_k"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"`{name}` must be at least 1; got {getattr(self, name)}", param=name)
        if self.limit is not None and int(self.limit) < 2:
            raise InputError(f"`limit` must be at least 2 sentences, or None for all; got {self.limit}", param="limit")
        if self.random_draws < 0 or self.n_boot < 0:
            raise InputError("`random_draws` and `n_boot` must be 0 or more", param=("random_draws", "n_boot"))
        for how in self.how:
            if how not in HOWS:
                raise InputError(f"`how`: {how!r} is not one of {', '.join(HOWS)}", param="how")
        for measure in self.measures or ():
            if measure not in MEASURES:
                raise InputError(f"`measures`: {measure!r} is not one of {', '.join(MEASURES)}", param="measures")
        if not self.dims or not self.how:
            raise InputError("give at least one `dims` and one `how`", param=("dims", "how"))
        for spec in self.dims:
            parse_dims(spec)

    def to_settings(self) -> dict[str, Any]:
        """The settings ablation.json records (where it ran and how it batched are left out)."""
        return {k: v for k, v in asdict(self).items() if k not in ("device", "batch_sentences", "extra", "data_dir")}


def parse_dims(spec: str) -> str | list[int]:
    """A `dims` entry: a kind (`rogue`, `outlier`, `massive`) or a comma list of dimension numbers."""
    spec = str(spec).strip()
    if spec in DIM_KINDS:
        return spec
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise InputError(f"`dims`: {spec!r} is neither one of {', '.join(DIM_KINDS)} nor a comma list of dimension numbers "
                         "(e.g. 507,247)", param="dims")
    return sorted({int(p) for p in parts})


def _label(spec: str | list[int]) -> str:
    return spec if isinstance(spec, str) else "given:" + ",".join(map(str, spec))


# ---- the unablated pass's statistics of a site -------------------------------------------------


@dataclass
class SiteStats:
    """What the unablated pass found at one (site, layer): every real position's vector (`rows`), which
    are special tokens, the median |h|, the massive cutoff and entries, and the dimensions of each kind."""

    site: str
    layer: int
    rows: np.ndarray
    special: np.ndarray
    median_abs: float
    cutoff: float
    dims: dict[str, list[int]]
    notes: dict[str, str]

    def massive_mask(self) -> np.ndarray:
        return np.abs(self.rows) > self.cutoff

    def record(self) -> dict[str, Any]:
        mask = self.massive_mask()
        where = np.nonzero(mask)
        massive_dims = sorted(set(int(d) for d in where[1]))
        return {"site": self.site, "layer": self.layer, "layer_name": rundir.layer_name(self.layer),
                "n_positions": int(len(self.rows)), "median_abs": self.median_abs, "massive_cutoff": self.cutoff,
                "max_abs": float(np.abs(self.rows).max()) if self.rows.size else None,
                "massive_entries": int(mask.sum()),
                "massive_per_dimension": {str(d): int(mask[:, d].sum()) for d in massive_dims},
                "massive_mean_value": {str(d): float(self.rows[mask[:, d], d].mean()) for d in massive_dims},
                "dimensions": self.dims, "notes": self.notes}


def site_stats(site: str, layer: int, rows: np.ndarray, special: np.ndarray, options: AblationOptions,
               geometry: dict[int, list[int]] | None) -> SiteStats:
    """The dimensions of each kind at one (site, layer) from its unablated rows."""
    from lmgeom.metrics.isotropy import rogue_dimensions
    from lmgeom.metrics.outliers import magnitude_outliers

    content = rows[~special]
    median = float(np.median(np.abs(rows)))
    cutoff = max(float(options.massive_min_magnitude), float(options.massive_min_ratio) * median)
    notes: dict[str, str] = {}
    dims: dict[str, list[int]] = {}
    if geometry is not None and site == "resid_post" and layer in geometry:
        dims["rogue"] = [int(d) for d in geometry[layer]]
        notes["rogue"] = f"from {options.geometry} (its store's words)"
    else:
        dims["rogue"] = [int(d) for d in rogue_dimensions(content, top_k=options.rogue_top_k).top_dimensions]
        notes["rogue"] = (f"the {options.rogue_top_k} largest contributions to the average cosine over the corpus's "
                          f"{len(content):,} pieces (special tokens left out)")
    dims["outlier"] = [int(d) for d in magnitude_outliers(np.abs(content).mean(axis=0)).dimensions]
    notes["outlier"] = "mean |h| over the pieces more than 3 standard deviations above the mean over dimensions"
    massive = np.abs(rows) > cutoff
    dims["massive"] = sorted(int(d) for d in np.flatnonzero(massive.any(axis=0)))
    notes["massive"] = (f"entries with |h| > {cutoff:.4g} (max of {options.massive_min_magnitude:g} and "
                        f"{options.massive_min_ratio:g} x the median |h| {median:.4g}), every position")
    return SiteStats(site, layer, rows, special, median, cutoff, dims, notes)


@dataclass(frozen=True)
class Ablation:
    """One ablation: where, which dimensions (`kind`: rogue, outlier, massive or given), how, and
    which draw (None: the dimensions themselves; k: the k-th random control)."""

    site: str
    layer: int
    kind: str
    how: str
    draw: int | None
    dims: tuple[int, ...]
    select: tuple[int, ...] | None

    def key(self) -> dict[str, Any]:
        return {"site": self.site, "layer": self.layer, "dims_kind": self.kind, "how": self.how, "draw": self.draw}


def plan_ablations(stats: SiteStats, options: AblationOptions) -> tuple[list[Ablation], list[str]]:
    """The ablations of one (site, layer): each dims entry x how, and its random controls; a kind with no
    dimension at this site is skipped with a note."""
    dim = stats.rows.shape[1]
    out: list[Ablation] = []
    notes: list[str] = []
    for index, spec in enumerate(options.dims):
        parsed = parse_dims(spec)
        kind = _label(parsed)
        if isinstance(parsed, list):
            bad = [d for d in parsed if d >= dim]
            if bad:
                raise InputError(f"`dims`: {bad} are not dimensions of a {dim}-dimensional site", param="dims")
            target = parsed
        else:
            target = stats.dims[parsed]
        if not target:
            notes.append(f"{stats.site} layer {stats.layer}: no {kind} dimension ({stats.notes.get(kind, '')}); "
                         f"not ablated")
            continue
        select = tuple(target) if kind == "massive" else None
        others = np.setdiff1d(np.arange(dim), target)
        for how in options.how:
            out.append(Ablation(stats.site, stats.layer, kind, how, None, tuple(target), select))
            for draw in range(options.random_draws):
                rng = np.random.default_rng([options.seed, stats.layer, index, draw])
                chosen = tuple(int(d) for d in rng.choice(others, size=len(target), replace=False))
                out.append(Ablation(stats.site, stats.layer, kind, how, draw, chosen, select))
    return out, notes


def edit_of(ablation: Ablation, stats: SiteStats) -> Any:
    """The `Edit` of an ablation, its mean values taken from the unablated rows over the entries it ablates."""
    from lmgeom.encoders.ablation import Edit

    dims = np.asarray(ablation.dims, dtype=np.int64)
    if ablation.select is None:
        values = stats.rows[:, dims].mean(axis=0) if ablation.how == "mean" else np.zeros(len(dims))
        return Edit(dims, values)
    select = np.asarray(ablation.select, dtype=np.int64)
    hit = np.abs(stats.rows[:, select]) > stats.cutoff
    if ablation.how == "mean":
        values = np.array([stats.rows[hit[:, j], d].mean() if hit[:, j].any() else 0.0 for j, d in enumerate(dims)])
    else:
        values = np.zeros(len(dims))
    return Edit(dims, values, select=select, cutoff=stats.cutoff)


def affected_attention_layers(site: str, layer: int, n_layers: int) -> list[int]:
    """The layers whose attention an edit at (`site`, `layer`) can change: block l's attention is computed
    from block l's input, so an edit of `resid_pre` (that input) reaches it, while an edit of block l's
    output or of a site after its attention (`resid_post`, `attn_out`, `mlp_out`, `resid_mid`) reaches
    the later blocks only; a module path is taken to reach block l too (it may sit before the attention)."""
    first = layer + 1 if site in ("resid_post", "attn_out", "mlp_out", "resid_mid") else max(layer, 1)
    return list(range(first, n_layers))


# ---- the measures ------------------------------------------------------------------------------


@dataclass
class Measured:
    """Per-item values of one model state (unablated or one ablation), for paired bootstraps:
    `loss` (sentence nll sums and token counts), `attention` (sentence x layer shares), `sts`
    (per layer, pair cosines), `pos` (per layer, test sentences' correct counts and word counts)."""

    loss: tuple[np.ndarray, np.ndarray] | None = None
    attention: np.ndarray | None = None
    sts: dict[int, np.ndarray] = field(default_factory=dict)
    pos: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    n_edited: int = 0


def _corpus_pass(encoder: HFEncoder, ids: list[list[int]], readout: Any, hooks: Sequence[Any], *, want_loss: bool,
                 want_attention: bool, batch: int, collect: bool) -> tuple[Measured, dict[int, list[np.ndarray]]]:
    """One pass over the corpus's token ids: per sentence nll and attention to the first position, and
    (with `collect`) every real position's tensor at each hook."""
    import torch

    from lmgeom.stages.lens import pad_batch

    model: Any = encoder.model
    device = encoder.device
    nll, counts, shares = [], [], []
    collected: dict[int, list[np.ndarray]] = {i: [] for i in range(len(hooks))}
    for begin in range(0, len(ids), batch):
        part = ids[begin:begin + batch]
        input_ids, mask = pad_batch(part, encoder.pad_id)
        for hook in hooks:
            hook.mask = mask.to(device)
        with torch.inference_mode():
            out = model(input_ids=input_ids.to(device), attention_mask=mask.to(device), output_attentions=want_attention,
                        use_cache=False)  # the loss reads the last hidden state, the sites their hooks
        if collect:
            flat = mask.reshape(-1).bool()
            for i, hook in enumerate(hooks):
                seen = hook.seen.detach().float().reshape(-1, hook.seen.shape[-1])[flat.to(hook.seen.device)]
                collected[i].append(seen.cpu().numpy())
        if want_loss:
            last = out.last_hidden_state
            for row, x in enumerate(part):
                if len(x) < 2:
                    nll.append(0.0)
                    counts.append(0)
                    continue
                h = last[row, : len(x) - 1]
                targets = torch.tensor(x[1:], dtype=torch.long, device=device)
                with torch.inference_mode():
                    nll.append(float(_token_nll(h, targets, readout).sum()))
                counts.append(len(x) - 1)
        if want_attention:
            for row, x in enumerate(part):
                n = len(x)
                per_layer = [float(a[row, :, 1:n, 0].mean()) if n > 1 else float("nan") for a in out.attentions]
                shares.append(per_layer)
    measured = Measured()
    if want_loss:
        measured.loss = (np.asarray(nll), np.asarray(counts, dtype=np.int64))
    if want_attention:
        measured.attention = np.asarray(shares)
    return measured, collected


def _token_nll(h: torch.Tensor, targets: torch.Tensor, readout: Any, rows_per_chunk: int = 256) -> torch.Tensor:
    """Cross-entropy (nats) of each row's target through the readout (norm where the last hidden state
    is before it, the unembedding with its bias and softcap)."""
    import torch

    if readout.norm is not None and readout.norm_last:
        h = readout.norm(h)
    out = []
    for start in range(0, len(h), rows_per_chunk):
        z = (h[start:start + rows_per_chunk].to(readout.weight.dtype) @ readout.weight.T).double()
        if readout.bias is not None:
            z = z + readout.bias.double()
        if readout.softcap:
            z = torch.tanh(z / readout.softcap) * readout.softcap
        t = targets[start:start + rows_per_chunk]
        out.append(torch.logsumexp(z, dim=-1) - z.gather(1, t[:, None])[:, 0])
    return torch.cat(out)


def _sts_pass(encoder: HFEncoder, texts: list[str], index1: np.ndarray, index2: np.ndarray, layers: Sequence[int],
              batch: int) -> dict[int, np.ndarray]:
    from lmgeom.evaluate.sts import pair_cosines

    vectors = encoder.sentence_embeddings(texts, batch_sentences=max(batch, 16))
    return {layer: pair_cosines(vectors[layer][index1], vectors[layer][index2]) for layer in layers}


def _pos_features(encoder: HFEncoder, sentences: list[list[str]], layers: Sequence[int], batch: int) -> dict[int, np.ndarray]:
    from lmgeom.corpus import Sentence

    out: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
    for begin in range(0, len(sentences), batch):
        encoded = encoder.encode([Sentence.from_words(words) for words in sentences[begin:begin + batch]], layers=list(layers))
        for sentence, words in zip(encoded, sentences[begin:begin + batch]):
            if sentence.vectors.shape[1] != len(words):
                raise InputError(f"a POS sentence's {len(words)} words gave {sentence.vectors.shape[1]} vectors (some words "
                                 "had no pieces); this model cannot be probed on it", param="measures")
            for k, layer in enumerate(layers):
                out[layer].append(np.asarray(sentence.vectors[k], dtype=np.float32))
    return {layer: np.concatenate(parts) for layer, parts in out.items()}


def _pos_pass(encoder: HFEncoder, pos: dict[str, Any], layers: Sequence[int], batch: int, seed: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    from lmgeom.stages.experiments.heads import fit_predict_sklearn

    train = _pos_features(encoder, pos["train_words"], layers, batch)
    test = _pos_features(encoder, pos["test_words"], layers, batch)
    out = {}
    for layer in layers:
        predicted = fit_predict_sklearn("logreg", False, train[layer], pos["train_y"], {"test": test[layer]}, seed=seed)["test"]
        correct = (predicted == pos["test_y"]).astype(np.int64)
        out[layer] = (np.add.reduceat(correct, pos["test_starts"]), np.diff(np.append(pos["test_starts"], len(correct))))
    return out


# ---- intervals ---------------------------------------------------------------------------------


def _value(measure: str, m: Measured, key: Any, index: np.ndarray | None, gold: np.ndarray | None) -> float:
    """A measure's value over the items `index` (None: all)."""
    from scipy.stats import spearmanr

    if measure == "loss":
        assert m.loss is not None
        nll, n = m.loss
        return float(nll[index].sum() / n[index].sum()) if index is not None else float(nll.sum() / n.sum())
    if measure == "attention":
        assert m.attention is not None
        a = m.attention[:, key]
        if a.ndim == 2:
            a = np.nanmean(a, axis=1)
        return float(np.nanmean(a[index] if index is not None else a))
    if measure == "sts":
        cos = m.sts[key]
        g = gold
        if index is not None:
            cos, g = cos[index], gold[index]  # type: ignore[index]
        return float(100 * spearmanr(g, cos).statistic)
    correct, words = m.pos[key]
    if index is not None:
        correct, words = correct[index], words[index]
    return float(correct.sum() / words.sum())


def _items(measure: str, m: Measured, key: Any) -> int:
    if measure == "loss":
        return len(m.loss[0])  # type: ignore[index]
    if measure == "attention":
        return len(m.attention)  # type: ignore[arg-type]
    if measure == "sts":
        return len(m.sts[key])
    return len(m.pos[key][0])


def effects(measure: str, key: Any, base: Measured, target: Measured, controls: Sequence[Measured], *, gold: np.ndarray | None,
            n_boot: int, seed: int) -> dict[str, Any]:
    """The measure for the unablated model, the ablation and its controls, the change and the change
    beyond the controls' mean, each change with a 95% percentile bootstrap interval over items
    (sentences or pairs; every state resampled alike)."""
    n = _items(measure, base, key)
    value = {"base": _value(measure, base, key, None, gold), "ablated": _value(measure, target, key, None, gold)}
    random_values = [_value(measure, c, key, None, gold) for c in controls]
    out: dict[str, Any] = {**value, "delta": value["ablated"] - value["base"], "n_items": n,
                           "random": random_values,
                           "random_delta_mean": float(np.mean(random_values) - value["base"]) if controls else None}
    out["excess"] = out["delta"] - out["random_delta_mean"] if controls else None
    if n_boot:
        rng = np.random.default_rng(seed)
        deltas, excess = [], []
        for _ in range(n_boot):
            index = rng.integers(0, n, size=n)
            b = _value(measure, base, key, index, gold)
            t = _value(measure, target, key, index, gold)
            deltas.append(t - b)
            if controls:
                r = np.mean([_value(measure, c, key, index, gold) for c in controls])
                excess.append(t - r)
        out["delta_low"], out["delta_high"] = (float(v) for v in np.nanquantile(deltas, [0.025, 0.975]))
        if controls:
            out["excess_low"], out["excess_high"] = (float(v) for v in np.nanquantile(excess, [0.025, 0.975]))
    return out


# ---- the stage ---------------------------------------------------------------------------------


@dataclass
class AblationResult:
    """What `run_ablation` computed: the document written and its files."""

    model_id: str
    document: dict[str, Any]
    paths: list[Any]
    seconds: float


def _load_geometry(path: str | None) -> dict[int, list[int]] | None:
    if path is None:
        return None
    document = rundir.read_json(Path(path), rundir.GEOMETRY.kind)
    if document is None:
        raise InputError(f"`geometry`: {path} does not exist; give a run's geometry.json (lmgeom geometry RUN)", param="geometry")
    return {int(layer["layer"]): [int(d) for d in layer.get("rogue_dimensions") or []] for layer in document["layers"]}


def _set_eager(model: Any) -> str:
    """Eager attention, which returns the attention weights; the implementation before it."""
    before = str(getattr(model.config, "_attn_implementation", None))
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = "eager"
    return before


def _unigram_nll(ids: list[list[int]]) -> float:
    """Cross-entropy (nats per token) of a unigram model fitted on the predicted tokens themselves (the
    trivial baseline of the next-token loss; fitted on the test tokens, so optimistic)."""
    targets = np.concatenate([np.asarray(x[1:]) for x in ids if len(x) > 1])
    _, counts = np.unique(targets, return_counts=True)
    p = counts / counts.sum()
    return float(-(counts * np.log(p)).sum() / counts.sum())


def _pos_data(data_dir: Path, options: AblationOptions) -> dict[str, Any]:
    from lmgeom.evaluate.baselines import most_frequent_tagger
    from lmgeom.evaluate.tasks import read_ud_pos

    task = read_ud_pos(data_dir / "UD_English-EWT")
    rng = np.random.default_rng(options.seed)
    train, test = task.splits["train"], task.splits["test"]
    pick_train = np.sort(rng.choice(len(train.sentences), size=min(options.pos_train, len(train.sentences)), replace=False))
    pick_test = np.sort(rng.choice(len(test.sentences), size=min(options.pos_test, len(test.sentences)), replace=False))
    tags = {tag: i for i, tag in enumerate(task.tagset)}
    train_words = [train.sentences[i] for i in pick_train]
    test_words = [test.sentences[i] for i in pick_test]
    train_tags = [train.tags[i] for i in pick_train]
    test_tags = [test.tags[i] for i in pick_test]
    tagger = most_frequent_tagger(train_words, train_tags)
    guessed = np.array([t for s in tagger.tag(test_words) for t in s])
    truth = np.array([t for s in test_tags for t in s])
    return {"train_words": train_words, "test_words": test_words,
            "train_y": np.array([tags.get(t, -1) for s in train_tags for t in s]),
            "test_y": np.array([tags.get(t, -1) for s in test_tags for t in s]),
            "test_starts": np.cumsum([0] + [len(s) for s in test_words[:-1]]),
            "most_frequent_tag": float((guessed == truth).mean()),
            "source": task.note, "n_train_words": int(sum(map(len, train_words))), "n_test_words": int(len(truth))}


def run_ablation(model: str, corpus: str, out: Path | str, options: AblationOptions | None = None, *,
                 progress: Progress | None = None) -> AblationResult:
    """Ablate each kind of dimension at each (site, layer), measure the effects and write them to
    `out`/ablation.json and ablation.csv.

    Parameters
    ----------
    model : str
        A named model (smollm2, gemma3, minilm, tiny-gpt2, ...), a Hugging Face id or a local folder.
    corpus : str
        The corpus the loss, the attention and the dimensions are measured on (`load_corpus`), cut to
        `options.limit` sentences.
    out : path
        The run directory to write into (a store of another model or corpus there is refused).
    options : AblationOptions, optional
        Where, what and how to ablate, what to measure.
    progress : Progress, optional
        Told of each model state measured.

    Returns
    -------
    AblationResult
    """
    from lmgeom.corpus import load_corpus
    from lmgeom.corpus.builtin import DEFAULT_DATA_DIR
    from lmgeom.encoders.ablation import SiteHook
    from lmgeom.encoders.registry import load_encoder
    from lmgeom.layerspec import select_layers
    from lmgeom.sitespec import parse_sites
    from lmgeom.stages.lens import readout_of, require_causal

    options = options or AblationOptions()
    progress = progress or NoProgress()
    started = time.perf_counter()
    sentences = load_corpus(corpus, limit=options.limit)
    encoder: Any = load_encoder(model, device=options.device, compute_dtype=options.compute_dtype)
    if not hasattr(encoder, "tokenizer"):
        raise InputError(f"{model} is not a transformers model; ablations edit a transformers model's forward pass",
                         param="model")
    try:
        require_causal(encoder)
        causal = True
    except InputError:
        causal = False
    measures = tuple(options.measures) if options.measures else (("loss", "attention") if causal else ("sts", "pos", "attention"))
    if "loss" in measures and not causal:
        raise InputError(f"{encoder.model_id} is not a causal decoder, so it has no next-token loss; measure sts, pos or "
                         "attention", param="measures")
    attention_before = _set_eager(encoder.model) if "attention" in measures else None
    readout = readout_of(encoder) if "loss" in measures else None
    n_layers = encoder.n_layers
    layers = select_layers(options.layers, list(range(n_layers)), param="layers")
    sites = list(parse_sites(options.sites))
    if "resid_post" not in [s.strip() for s in str(options.sites).split(",")]:
        sites.remove("resid_post")
    data_dir = Path(options.data_dir or os.environ.get("LMGEOM_DATA") or DEFAULT_DATA_DIR)
    geometry = _load_geometry(options.geometry)
    special_ids = set(int(i) for i in encoder.tokenizer.all_special_ids)
    ids = [list(x) for x in encoder.tokenizer([s.text for s in sentences.sentences], truncation=True,
                                              max_length=encoder.max_length)["input_ids"]]
    batch = int(options.batch_sentences)
    last = n_layers - 1
    want_loss, want_attention = "loss" in measures, "attention" in measures

    sts: dict[str, Any] | None = None
    pos: dict[str, Any] | None = None
    if "sts" in measures:
        from lmgeom.evaluate.sts_data import read_stsb

        pairs = read_stsb(data_dir / "stsbenchmark", "test").sample(options.sts_pairs, seed=options.seed)
        texts = pairs.sentences
        where = {t: i for i, t in enumerate(texts)}
        sts = {"texts": texts, "i1": np.array([where[t] for t in pairs.sentences1]),
               "i2": np.array([where[t] for t in pairs.sentences2]), "gold": pairs.scores, "n_pairs": len(pairs),
               "source": "STS-B test (stsbenchmark/sts-test.csv)"}
    if "pos" in measures:
        pos = _pos_data(data_dir, options)

    def measure(hooks: Sequence[Any], at: Sequence[int], *, collect: bool = False) -> tuple[Measured, dict[int, list[np.ndarray]]]:
        measured, collected = Measured(), dict[int, list[np.ndarray]]()
        if want_loss or want_attention or collect:
            measured, collected = _corpus_pass(encoder, ids, readout, hooks, want_loss=want_loss,
                                               want_attention=want_attention, batch=batch, collect=collect)
            measured.n_edited = sum(h.n_edited for h in hooks)
            for hook in hooks:
                hook.mask = None
        if sts is not None:
            measured.sts = _sts_pass(encoder, sts["texts"], sts["i1"], sts["i2"], at, batch)
        if pos is not None:
            measured.pos = _pos_pass(encoder, pos, at, batch, options.seed)
        if not (want_loss or want_attention):
            measured.n_edited = sum(h.n_edited for h in hooks)
        return measured, collected

    places = [(site, layer) for site in sites for layer in layers if not (site != "resid_post" and layer == 0)]
    if not places:
        raise InputError("no (site, layer) to ablate: sites other than resid_post exist at layers 1 and up", param="layers")
    progress.start("unablated model", 1, unit="model states")
    observers = [SiteHook(encoder.model, site, layer) for site, layer in places]
    for hook in observers:
        hook.__enter__()
    try:
        base, collected = measure(observers, sorted({layer for _, layer in places} | {last}), collect=True)
    finally:
        for hook in observers:
            hook.__exit__()
    progress.advance("unablated model", 1)
    special_flat = np.concatenate([np.isin(np.asarray(x), list(special_ids)) for x in ids])
    stats = {}
    for i, place in enumerate(places):
        stats[place] = site_stats(place[0], place[1], np.concatenate(collected[i]), special_flat, options, geometry)
    del collected
    plans = {place: plan_ablations(stats[place], options) for place in places}
    stage = f"ablations of {encoder.model_id}"
    progress.start(stage, sum(len(planned) for planned, _ in plans.values()), unit="model states")

    configs: list[dict[str, Any]] = []
    notes: list[str] = []
    rows_csv: list[dict[str, Any]] = []
    n_states = 1
    for place in places:
        planned, skipped = plans[place]
        notes += skipped
        states: dict[tuple[str, str, int | None], tuple[Ablation, Measured]] = {}
        for ablation in planned:
            with SiteHook(encoder.model, ablation.site, ablation.layer, edit_of(ablation, stats[place])) as hook:
                measured, _ = measure([hook], sorted({ablation.layer, last}))
            states[(ablation.kind, ablation.how, ablation.draw)] = (ablation, measured)
            n_states += 1
            progress.advance(stage, 1)
        for (kind, how, draw), (ablation, measured) in states.items():
            if draw is not None:
                continue
            group = [(a, m) for (k, h, d), (a, m) in states.items() if k == kind and h == how and d is not None]
            controls = [m for _, m in group]
            entry: dict[str, Any] = {**ablation.key(), "layer_name": rundir.layer_name(ablation.layer),
                                     "dims": list(ablation.dims), "n_dims": len(ablation.dims),
                                     "random_dims": [list(a.dims) for a, _ in group],
                                     "n_edited": measured.n_edited, "random_n_edited": [m.n_edited for m in controls],
                                     "effects": {}}
            seed = options.seed + 7919 * ablation.layer
            if want_loss:
                entry["effects"]["loss"] = effects("loss", None, base, measured, controls, gold=None,
                                                   n_boot=options.n_boot, seed=seed)
            after = affected_attention_layers(ablation.site, ablation.layer, n_layers)
            if want_attention and after:
                entry["effects"]["attention_first_mean"] = {
                    **effects("attention", [layer - 1 for layer in after], base, measured, controls, gold=None,
                              n_boot=options.n_boot, seed=seed), "layers": after}
                entry["effects"]["attention_first"] = {
                    str(layer): effects("attention", layer - 1, base, measured, controls, gold=None, n_boot=0, seed=seed)
                    for layer in after}
            for name, data in (("sts", sts), ("pos", pos)):
                if data is None:
                    continue
                for at, label in ((ablation.layer, "layer"), (last, "last"))[: 1 if ablation.layer == last else 2]:
                    entry["effects"][f"{name}_{label}"] = {
                        **effects(name, at, base, measured, controls, gold=sts["gold"] if name == "sts" and sts else None,
                                  n_boot=options.n_boot, seed=seed), "at_layer": at}
            configs.append(entry)
            for measure_name, value in entry["effects"].items():
                subs = [(None, value)] if "base" in value else list(value.items())
                for sub_key, sub in subs:
                    rows_csv.append({**ablation.key(), "n_dims": len(ablation.dims), "n_edited": measured.n_edited,
                                     "measure": measure_name if sub_key is None else f"{measure_name}@{sub_key}",
                                     **{k: sub.get(k) for k in ("base", "ablated", "delta", "delta_low", "delta_high",
                                                                "random_delta_mean", "excess", "excess_low", "excess_high")}})
    seconds = time.perf_counter() - started
    baseline: dict[str, Any] = {}
    trivial: dict[str, Any] = {}
    if want_loss:
        baseline["loss"] = _value("loss", base, None, None, None)
        trivial["loss_unigram"] = _unigram_nll(ids)
        trivial["loss_unigram_note"] = "a unigram model of the predicted tokens, fitted on them (optimistic)"
    if want_attention:
        assert base.attention is not None
        baseline["attention_first"] = {str(layer + 1): float(np.nanmean(base.attention[:, layer]))
                                       for layer in range(base.attention.shape[1])}
    if pos is not None:
        trivial["pos_most_frequent_tag"] = pos["most_frequent_tag"]
        baseline["pos"] = {str(layer): _value("pos", base, layer, None, None) for layer in base.pos}
    if sts is not None:
        baseline["sts"] = {str(layer): _value("sts", base, layer, None, sts["gold"]) for layer in base.sts}
    settings = {**options.to_settings(), "measures": list(measures), "model_id": encoder.model_id,
                "model_fingerprint": encoder.model_fingerprint, "corpus": corpus, "corpus_name": sentences.name,
                "corpus_fingerprint": sentences.fingerprint, "layers_resolved": layers, "sites_resolved": sites}
    counts = {"n_sentences": len(ids), "n_positions": int(sum(len(x) for x in ids)),
              "n_predicted_tokens": int(sum(max(len(x) - 1, 0) for x in ids)), "n_layers": n_layers,
              "n_model_states": n_states, "n_edited_over": ("the corpus's real positions" if want_loss or want_attention
                                                            else "the STS and POS passes' positions, padding included")}
    if sts is not None:
        counts["sts_pairs"] = sts["n_pairs"]
    if pos is not None:
        counts["pos_train_words"], counts["pos_test_words"] = pos["n_train_words"], pos["n_test_words"]
    document = {
        "settings": settings, "counts": counts, "seconds": round(seconds, 1), "device": str(encoder.device),
        "model": {"causal": causal, "attention_implementation_before": attention_before,
                  "last_layer": encoder.last_layer, "readout": readout.description if readout else None},
        "sites": [stats[p].record() for p in places], "baseline": baseline, "trivial": trivial,
        "data": {"sts": sts["source"] if sts else None, "pos": pos["source"] if pos else None},
        "configs": configs, "notes": notes,
        "definitions": {
            "layer": "0 = the embedding output; resid_post of layer l is block l's output (the last block's before the final norm)",
            "zero": "the ablated entries set to 0",
            "mean": "the ablated entries set to their dimension's mean over the same entries in the unablated pass",
            "massive": "the (token, dimension) entries above the cutoff; its control: the same tokens in as many random dimensions",
            "delta": "ablated minus unablated, with a 95% bootstrap interval over items (sentences; STS: pairs)",
            "excess": "ablated minus the random controls' mean, with the same bootstrap",
            "loss": "next-token cross-entropy, nats per token, through the final norm and the tied unembedding",
            "attention_first": "attention share to the first position at layer l (mean over heads and later positions)",
            "sts_layer / sts_last": "STS-B Spearman x 100 of mean-pooled sentence vectors at the ablated / last layer",
            "pos_layer / pos_last": "linear probe UPOS accuracy at the ablated / last layer, refitted per ablation",
        },
    }
    meta = {"model_id": encoder.model_id, "corpus_fingerprint": sentences.fingerprint}
    store_meta = rundir.read_store_meta(Path(out)) if Path(out).exists() else None
    if store_meta and store_meta.get("corpus_fingerprint") != sentences.fingerprint:
        raise InputError(f"{out} holds a store of another corpus ({store_meta.get('corpus_name')}); write the ablations to a "
                         "run of their own with `out`", param="out")
    buffer = io.StringIO()
    pd.DataFrame(rows_csv).to_csv(buffer, index=False)
    Path(out).mkdir(parents=True, exist_ok=True)
    paths = rundir.write_result_set(rundir.ABLATION.at(Path(out)), rundir.ABLATION.kind, document,
                                    store_meta=store_meta or meta, settings=settings,
                                    companions=[(rundir.ABLATION_CSV.at(Path(out)), buffer.getvalue().encode())])
    return AblationResult(encoder.model_id, document, paths, seconds)
