"""Extraction and analysis beyond one process: shards of a corpus and of a store, on Ray or locally.

Extraction (`extract_sharded`): the corpus is streamed and cut into shards of whole sentences as it
is read (a first pass counts and fingerprints it; the driver holds only the shards in flight); each
shard is encoded and written as its own store part with its sentence table (`lmgeom.store.sharded`),
then one final step writes the global tables (word ids over all shards) and the shard index. Engines:
- `local`: one process writes the shards in turn (what `extract` does for a store on an object store);
- `ray`: a pool of Ray Core actors, each holding one model (`num_gpus` per actor). Actors rather than
  Ray Data's `map_batches`: a shard is a write with its own commit and returns only its manifest, the
  driver must skip finished shards and hand a killed actor's shard to a restarted one, and it feeds
  shards as actors free up, so only the shards in flight leave the driver. Ray Data would add its
  block executor to carry nothing but a list of shard numbers.
A killed actor is restarted and its shard redone (`max_retries`); a failed run resumes: shards with a
manifest are skipped, the others are written afresh.

Analysis (`analyze_ray`): Ray tasks return accumulator states that the driver merges with `merge()`.
Tasks are partitioned so that none holds per-word state for the whole vocabulary: per layer, a task
per row range (cut at sentence starts) for the global statistics (baselines, norms, intra-sentence
similarity, the sampled rows), and a task per row range and word group (`plan_word_groups`, the
MEV memory budget) for the per-word ones (self-similarity and MEV of that group's words only). The
merged result equals `analyze_store` of the same store (closed-form statistics to float64 rounding).
"""

from __future__ import annotations

import itertools
import logging
import os
import tempfile
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Container, Iterable, Iterator, Mapping, Sequence, cast

import numpy as np

from lmgeom.errors import InputError, MissingDependency
from lmgeom.corpus.builtin import open_corpus
from lmgeom.corpus.corpus import Corpus, CorpusStream, CorpusSummary, Fingerprint, Sentence
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.options import EncoderOptions
from lmgeom.metrics.base import StatefulAccumulator
from lmgeom.metrics.contextuality import (
    AverageCosineAccumulator,
    IntraSentenceAccumulator,
    MeanNormAccumulator,
    MEVAccumulator,
    RowSampleAccumulator,
    SelfSimilarityAccumulator,
)
from lmgeom.progress import NoProgress, Progress
from lmgeom.runs.analysis import (
    AnalysisOptions,
    ContextualityResult,
    LayerAccumulators,
    _layer_stats,
    _require_two_contexts,
    _result,
    empty_mev,
    plan_analysis,
    record_mev,
)
from lmgeom.runs.extraction import ExtractionOptions
from lmgeom.runs.tally import DEFAULT_CHUNK_ROWS, layer_chunks, require_finite, stored_chunks, stored_float_rows
from lmgeom.store import RepresentationStore, layout
from lmgeom.store.location import Location
from lmgeom.store.sharded import ShardedStoreWriter, ShardPartWriter
from lmgeom.store.writer import require_store_or_empty

ENGINES = ("local", "ray")
EncoderFactory = Callable[[], Encoder]


def default_shard_sentences(n_sentences: int, chunk_sentences: int, *, num_workers: int = 1) -> int:
    """Sentences per shard: about four shards a worker (so a killed shard costs little and the last
    ones balance), in whole chunks (as a local run would chunk them), 1 to 16 chunks."""
    chunks = -(-n_sentences // (max(1, 4 * num_workers) * chunk_sentences))
    return int(min(16, max(1, chunks)) * chunk_sentences)


def connect_ray(address: str | None = None) -> ModuleType:
    """Ray, joined to the cluster at `address` (or RAY_ADDRESS), or a local one started here."""
    try:
        import ray
    except ImportError:
        raise MissingDependency("the ray engine needs Ray: pip install 'lmgeom[ray]' (or use the local engine)") from None
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS"), logging_level=logging.WARNING)
    return ray


def store_settings(encoder_settings: dict[str, Any], corpus: Corpus | CorpusStream, summary: CorpusSummary,
                   options: ExtractionOptions) -> dict[str, Any]:
    """What makes two sharded extractions the same run (as `extract` records, with the shard size):
    `options` resolved (`ExtractionOptions.resolve`, and its `shard_sentences`)."""
    return {
        **encoder_settings, "corpus_name": corpus.name, "corpus_source": corpus.source,
        "corpus_fingerprint": summary.fingerprint, "n_corpus_sentences": summary.n_sentences,
        "pretokenized": summary.pretokenized, **options.to_settings(),
    }


def encode_shard(encoder: Encoder, url: str, settings: dict[str, Any], shard: int, first_sentence: int,
                 sentences: Sequence[Sentence]) -> dict[str, Any]:
    """Encode one shard into a part of its own, window by window (sorted by length within a window of
    `sort_window` sentences, cut from the shard's start), then commit it; returns its manifest."""
    layers = layout.stored_layers(settings)
    writer = ShardPartWriter(Location.of(url), shard, first_sentence=first_sentence, n_layers=int(settings["n_layers"]),
                             dim=int(settings["dim"]), dtype=str(settings["dtype"]),
                             expected_rows=layout.expected_rows(sentences), compressor=settings.get("compressor"),
                             layers=layers)
    subset = {"layers": layers} if len(layers) < int(settings["n_layers"]) else {}
    step = int(settings.get("sort_window") or settings["chunk_sentences"])
    for start in range(0, len(sentences), step):
        window = sentences[start : start + step]
        writer.append(encoder.encode(window, first_index=first_sentence + start, **subset), [s.text for s in window])
    return writer.commit()


@dataclass(frozen=True)
class Shard:
    """One shard's sentences, read from the corpus stream: shard number and first sentence (global)."""

    number: int
    first_sentence: int
    sentences: list[Sentence]


def cut_shards(corpus: Iterable[Sentence], spans: Sequence[range], summary: CorpusSummary, *,
               skip: Container[int] = ()) -> Iterator[Shard]:
    """The shards of `spans` as the corpus is read, one at a time: only the shard being handed out is
    held. Shards in `skip` (finished) are read past; a corpus that no longer matches its first pass
    (other length or content) is an error before the store is finished."""
    stream = iter(corpus)
    fingerprint = Fingerprint()
    for number, span in enumerate(spans):
        sentences = list(itertools.islice(stream, len(span)))
        for sentence in sentences:
            fingerprint.add(sentence)
        if len(sentences) != len(span):
            raise _corpus_changed(summary, f"it ended after {fingerprint.n_sentences} sentences")
        if number not in skip:
            yield Shard(number, span.start, sentences)
    if next(stream, None) is not None:
        raise _corpus_changed(summary, "it has more sentences")
    if fingerprint.hexdigest() != summary.fingerprint:
        raise _corpus_changed(summary, "its sentences differ")


def _corpus_changed(summary: CorpusSummary, how: str) -> InputError:
    return InputError(f"the corpus changed while it was read ({summary.n_sentences} sentences at the first pass; now {how}); "
                      "keep the corpus fixed during an extraction, and re-run with `overwrite=True` if it changed on purpose",
                      param="overwrite")


class ShardWorker:
    """A Ray actor: one model, loaded once, encoding shard after shard."""

    def __init__(self, make_encoder: EncoderFactory) -> None:
        self.encoder = make_encoder()

    def settings(self) -> dict[str, Any]:
        return self.encoder.settings()

    def encode_shard(self, url: str, settings: dict[str, Any], shard: int, first_sentence: int,
                     sentences: Sequence[Sentence]) -> dict[str, Any]:
        return encode_shard(self.encoder, url, settings, shard, first_sentence, sentences)


def extract_sharded(
    make_encoder: EncoderFactory | Encoder,
    corpus: Corpus | CorpusStream | str,
    out: str | os.PathLike[str] | Location,
    options: ExtractionOptions | None = None,
    *,
    max_retries: int = 2,
    overwrite: bool = False,
    progress: Progress | None = None,
    **keywords: Any,
) -> RepresentationStore:
    """Encode `corpus` into a sharded store at `out` (a folder or an fsspec URL); re-running resumes.

    `corpus` is a corpus in memory, a `CorpusStream`, or a corpus spec (streamed with `open_corpus`'s
    defaults). A stream is read twice and never held whole: a first pass counts and fingerprints it
    (the shards and the run's identity), the second cuts the shards as it reads and hands each to a
    worker as one frees up, so the driver holds only the shards in flight (`num_workers`).
    `make_encoder` builds the model in each worker (Ray pickles it to the actors); the local engine
    also takes an encoder itself. `options` (`ExtractionOptions`, or its fields as keywords):
    `chunk_sentences` and the stored layers default as in `extract` for the workers' model,
    `sort_window` to one chunk (shards run in parallel, each sorted chunk by chunk); `shard_sentences` defaults to `default_shard_sentences` (a resumed run keeps its own). With
    `engine="ray"`, `num_workers` actors with `gpus_per_worker` GPUs each encode the shards; a killed
    actor is restarted and its shard redone up to `max_retries` times, after which the run stops and a
    re-run resumes it."""
    options = ExtractionOptions.of(options, **keywords)
    engine, num_workers, gpus_per_worker = options.engine, options.num_workers, options.gpus_per_worker
    if engine not in ENGINES:
        raise InputError(f"unknown `engine` {engine!r}; use one of {', '.join(ENGINES)}", param="engine")
    if num_workers < 1 or gpus_per_worker < 0:
        raise InputError(f"`num_workers` must be at least 1 and `gpus_per_worker` at least 0; got {num_workers}, {gpus_per_worker}",
                         param=("num_workers", "gpus_per_worker"))
    if engine == "local" and (num_workers != 1 or gpus_per_worker):
        raise InputError("`num_workers` and `gpus_per_worker` apply to `engine='ray'`; add `engine='ray'` or leave them out",
                         param=("num_workers", "gpus_per_worker", "engine"))
    location = Location.of(out)
    progress = progress or NoProgress()
    if engine == "ray" and location.url.startswith("memory://"):
        raise InputError("a memory:// store lives inside one process, so Ray workers cannot write it; "
                         "use a folder every worker sees or an object store URL (s3://, gs://)")
    require_store_or_empty(location)  # a folder of other files is refused before Ray or a model starts
    source = open_corpus(corpus) if isinstance(corpus, str) else corpus
    summary = source.summary()  # a pass over a stream (free in memory), before any model loads
    if engine == "ray":
        ray = connect_ray(options.ray_address)
        actor = ray.remote(ShardWorker).options(num_cpus=1, num_gpus=gpus_per_worker, max_restarts=-1,
                                                max_task_retries=max_retries)
        workers = [actor.remote(make_encoder) for _ in range(num_workers)]
        encoder_settings = ray.get(workers[0].settings.remote())
    else:
        encoder = cast(Encoder, make_encoder) if hasattr(make_encoder, "encode") else cast(EncoderFactory, make_encoder)()
        encoder_settings = encoder.settings()
    if not overwrite and location.exists(layout.META):
        # a resumed run keeps its shards (whatever the number of workers now), chunks and windows
        recorded = location.read_json(layout.META).get("settings", {})
        if recorded.get("chunk_sentences") and options.chunk_sentences in (None, recorded["chunk_sentences"]):
            options = replace(options, chunk_sentences=recorded["chunk_sentences"],
                              sort_window=options.sort_window or recorded.get("sort_window") or recorded["chunk_sentences"],
                              shard_sentences=options.shard_sentences or recorded.get("shard_sentences"))
    # shards are encoded in parallel: by default each chunk is sorted on its own, not a window of the corpus
    options = options.resolve(int(encoder_settings["n_layers"]), int(encoder_settings["dim"]), summary.n_sentences,
                              sort_window=options.sort_window or "chunk")
    shard_sentences = options.shard_sentences or default_shard_sentences(summary.n_sentences, int(options.sort_window or 0),
                                                                        num_workers=num_workers)
    if shard_sentences % int(options.sort_window or 0):  # a shard is whole windows, as a local run cuts them
        shard_sentences += int(options.sort_window or 0) - shard_sentences % int(options.sort_window or 0)
    options = replace(options, shard_sentences=shard_sentences)
    settings = store_settings(encoder_settings, source, summary, options)
    with ShardedStoreWriter(location, settings=settings, overwrite=overwrite) as writer:  # its lock is released however this ends
        stage = f"extract {source.name}"
        progress.start(stage, summary.n_sentences, unit="sentences")
        if not writer.complete:
            done = writer.finished()
            if done:
                progress.advance(stage, sum(int(m["n_sentences"]) for m in done.values()), note=f"resumed: {len(done)} shards done")
            shards = cut_shards(source, writer.shards, summary, skip=done)
            if engine == "ray":
                _encode_on_ray(ray, workers, location.url, settings, shards, progress, stage)
            else:
                for shard in shards:
                    encode_shard(encoder, location.url, settings, shard.number, shard.first_sentence, shard.sentences)
                    progress.advance(stage, len(shard.sentences), note=f"shard {shard.number}")
            writer.finalize()
    return RepresentationStore.open(location)


def _encode_on_ray(ray: ModuleType, workers: list[Any], url: str, settings: dict[str, Any], shards: Iterator[Shard],
                   progress: Progress, stage: str) -> None:
    """Hand shards to idle actors, one at a time each, reading the next shard only when an actor is
    free, until every shard is committed."""
    idle = list(workers)
    running: dict[Any, tuple[int, int, int, Any]] = {}
    exhausted = False
    while True:
        while idle and not exhausted:
            shard = next(shards, None)
            if shard is None:
                exhausted = True
                break
            worker = idle.pop()
            task = worker.encode_shard.remote(url, settings, shard.number, shard.first_sentence, shard.sentences)
            running[task] = (shard.number, shard.first_sentence, len(shard.sentences), worker)
        if not running:
            return
        (ready,), _ = ray.wait(list(running), num_returns=1)
        number, first, size, worker = running.pop(ready)
        try:
            ray.get(ready)
        except ray.exceptions.RayError as error:
            for other in workers:  # no worker keeps writing once the run has stopped
                ray.kill(other)
            raise RuntimeError(f"shard {number} (sentences {first}-{first + size - 1}) failed on its worker after its "
                               f"retries: {str(error).splitlines()[0]}; re-run the same command to resume "
                               "(finished shards are kept)") from error
        idle.append(worker)
        progress.advance(stage, size, note=f"shard {number}")


def extract_model_sharded(
    model: str,
    corpus: str,
    out: str | os.PathLike[str] | Location,
    options: ExtractionOptions | None = None,
    encoder: EncoderOptions | None = None,
    *,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RepresentationStore:
    """`extract_model` with the corpus spec streamed (`open_corpus`) into a sharded store: what
    `lmgeom extract` runs for `--engine ray` and for a store on an object store. `encoder` goes to
    `load_encoder` in each worker; `options` to `open_corpus` (which sentences) and `extract_sharded`."""
    from lmgeom.encoders.registry import load_encoder  # torch: only where a model is loaded

    options = options or ExtractionOptions()
    stream = open_corpus(corpus, field=options.field, pretokenized=options.pretokenized, limit=options.limit,
                         sample=options.sample, seed=options.seed)
    return extract_sharded(partial(load_encoder, model, encoder), stream, out, options, overwrite=overwrite, progress=progress)


# ---------------------------------------------------------------------------------------------
# analysis


@dataclass(frozen=True)
class _GlobalTask:
    """Rows [start, stop) of a layer: the selected rows' mask, sentence ids and the sampled rows."""

    layer: int
    start: int
    stop: int
    mask: np.ndarray
    sentence_ids: np.ndarray
    sampled_rows: np.ndarray


@dataclass(frozen=True)
class _WordGroupTask:
    """Rows [start, stop) of a layer, for the words of one group: each row's index within the group (-1: not in it)."""

    layer: int
    start: int
    stop: int
    group: int
    local_ids: np.ndarray
    n_group_words: int


def _global_states(url: str, meta: dict[str, Any], task: _GlobalTask, chunk_rows: int) -> dict[str, Any]:
    store = RepresentationStore(Location.of(url), meta)
    baseline, norms, intra = AverageCosineAccumulator(), MeanNormAccumulator(), IntraSentenceAccumulator()
    sample = RowSampleAccumulator(task.sampled_rows)
    for start, X in layer_chunks(store, task.layer, rows=(task.start, task.stop), chunk_rows=chunk_rows):
        local = slice(start - task.start, start - task.start + len(X))
        keep = task.mask[local]
        if not keep.any():
            continue
        rows = X[keep]
        baseline.add(rows)
        norms.add(rows)
        intra.add(rows, sentence_ids=task.sentence_ids[local][keep])
        sample.add(rows, rows=np.arange(start, start + len(X))[keep])
    return {name: acc.state_dict() for name, acc in (("baseline", baseline), ("norms", norms), ("intra", intra), ("sample", sample))}


def _word_group_states(url: str, meta: dict[str, Any], task: _WordGroupTask, chunk_rows: int) -> dict[str, Any]:
    store = RepresentationStore(Location.of(url), meta)
    group_ids = task.local_ids[task.local_ids >= 0]
    self_similarity = SelfSimilarityAccumulator(task.n_group_words)
    mev = MEVAccumulator(task.n_group_words, expected_counts=np.bincount(group_ids, minlength=task.n_group_words))
    for start, chunk in stored_chunks(store, task.layer, rows=(task.start, task.stop), chunk_rows=chunk_rows):
        require_finite(store, task.layer, chunk, start)
        ids = task.local_ids[start - task.start : start - task.start + len(chunk)]
        keep = ids >= 0
        if keep.any():
            rows = stored_float_rows(chunk[keep])  # MEV keeps float32 rows as float32, as `tally` hands them
            self_similarity.add(rows, word_ids=ids[keep])
            mev.add(rows, word_ids=ids[keep])
    return {"self_similarity": self_similarity.state_dict(), "mev": mev.state_dict()}


_STATE_CLASSES: dict[str, type[StatefulAccumulator]] = {
    "baseline": AverageCosineAccumulator, "norms": MeanNormAccumulator, "intra": IntraSentenceAccumulator,
    "sample": RowSampleAccumulator, "self_similarity": SelfSimilarityAccumulator, "mev": MEVAccumulator,
}


def _accumulators(states: dict[str, Any]) -> dict[str, Any]:
    return {name: _STATE_CLASSES[name].from_state_dict(state) for name, state in states.items()}


def row_partitions(first_rows: np.ndarray, n_rows: int, parts: int) -> list[tuple[int, int]]:
    """About `parts` row ranges of similar size covering [0, n_rows), each starting at a sentence's first row."""
    targets = np.linspace(0, n_rows, max(1, parts) + 1)[1:-1]
    cuts = np.unique(first_rows[np.clip(np.searchsorted(first_rows, targets), 0, len(first_rows) - 1)])
    bounds = [0, *[int(c) for c in cuts if 0 < c < n_rows], n_rows]
    return list(zip(bounds[:-1], bounds[1:]))


def analyze_ray(
    store: RepresentationStore | str | os.PathLike[str],
    options: AnalysisOptions = AnalysisOptions(),
    *,
    num_workers: int = 2,
    row_parts: int | None = None,
    ray_address: str | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    progress: Progress | None = None,
) -> ContextualityResult:
    """`analyze_store` as Ray tasks whose accumulator states are merged with `merge()` (see the module
    docstring); at most `num_workers` tasks run at once, over `row_parts` row ranges (default 2 per worker)."""
    ray = connect_ray(ray_address)
    store = store if isinstance(store, RepresentationStore) else RepresentationStore.open(store)
    progress = progress or NoProgress()
    _require_two_contexts(options.min_contexts)
    plan = plan_analysis(store, options)
    spans = row_partitions(store.sentences["first_row"].to_numpy(), store.n_tokens, row_parts or 2 * num_workers)
    group_words = [np.flatnonzero(plan.groups == group) for group in range(plan.n_groups)]
    word_index = plan.words.word_index
    local_index = np.full(len(plan.words), -1, dtype=np.int64)
    for words in group_words:
        local_index[words] = np.arange(len(words))
    group_of_row = np.where(word_index >= 0, plan.groups[np.maximum(word_index, 0)], -1)
    local_of_row = np.where(word_index >= 0, local_index[np.maximum(word_index, 0)], -1)

    global_task = ray.remote(num_cpus=1)(_global_states)
    group_task = ray.remote(num_cpus=1)(_word_group_states)
    meta = ray.put(store.meta)

    def tasks() -> Iterator[tuple[tuple[int, int], Callable[[], Any]]]:
        """(key, submit) in the order their merged states can be finished: a layer's global rows, then its groups."""
        for layer in plan.layers:
            for start, stop in spans:
                task = _GlobalTask(layer, start, stop, plan.selection.mask[start:stop], plan.selection.sentence_ids[start:stop],
                                   plan.sampled_rows)
                yield (layer, -1), lambda task=task: global_task.remote(store.url, meta, task, chunk_rows)  # type: ignore[misc]
            for group, words in enumerate(group_words):
                for start, stop in spans:
                    in_group = group_of_row[start:stop] == group
                    if not in_group.any():
                        continue
                    word_task = _WordGroupTask(layer, start, stop, group, np.where(in_group, local_of_row[start:stop], -1), len(words))
                    yield (layer, group), lambda task=word_task: group_task.remote(store.url, meta, task, chunk_rows)  # type: ignore[misc]

    submitted = list(tasks())
    expected: dict[tuple[int, int], int] = {}
    for key, _ in submitted:
        expected[key] = expected.get(key, 0) + 1
    merged: dict[tuple[int, int], dict[str, Any]] = {}
    finished: dict[int, dict[str, Any]] = {layer: {"mev": empty_mev(len(plan.words)), "values": np.full(len(plan.words), np.nan),
                                                  "counts": np.zeros(len(plan.words), dtype=np.int64)} for layer in plan.layers}
    progress.start("analyze on ray", len(submitted), unit="tasks")
    for key, states in _bounded(ray, submitted, max_in_flight=num_workers):
        accumulators = _accumulators(states)
        if key in merged:
            for name, accumulator in accumulators.items():
                merged[key][name].merge(accumulator)
        else:
            merged[key] = accumulators
        expected[key] -= 1
        progress.advance("analyze on ray", note=f"layer {key[0]}")
        layer, group = key
        if expected[key] or group < 0:
            continue
        # a word group is complete: keep its words' results, drop its per-word state
        parts, words = merged.pop(key), group_words[group]
        finished[layer]["values"][words] = parts["self_similarity"].result()
        finished[layer]["counts"][words] = parts["self_similarity"].counts
        record_mev(finished[layer]["mev"], parts["mev"].result(), words)
    stats = []
    for layer in plan.layers:
        rows = merged.pop((layer, -1))
        layer_rows = LayerAccumulators(rows["baseline"], rows["norms"], rows["intra"], SelfSimilarityAccumulator(len(plan.words)),
                                       rows["sample"], {})
        stats.append(_layer_stats(layer, layer_rows, finished[layer]["mev"],
                                  self_similarity=(finished[layer]["values"], finished[layer]["counts"])))
    return _result(store, plan, stats)


def _bounded(ray: ModuleType, submitted: list[tuple[Any, Callable[[], Any]]], *, max_in_flight: int) -> Iterator[tuple[Any, Any]]:
    """(key, result) of each submitted task as it finishes, with at most `max_in_flight` running."""
    queue = iter(submitted)
    running: dict[Any, Any] = {}
    for key, submit in queue:
        running[submit()] = key
        if len(running) >= max_in_flight:
            break
    while running:
        (ready,), _ = ray.wait(list(running), num_returns=1)
        key = running.pop(ready)
        next_task = next(queue, None)
        if next_task is not None:
            running[next_task[1]()] = next_task[0]
        yield key, ray.get(ready)


def write_contextuality(result: ContextualityResult, store: RepresentationStore, out: str | os.PathLike[str] | None) -> list[str]:
    """Write the result files to `out` (a folder or URL; default: next to the store, on any filesystem)."""
    target = Location.of(out) if out is not None else store.location
    if target.is_local:
        return [str(path) for path in result.write(target.local_path).values()]
    with tempfile.TemporaryDirectory() as scratch:
        written = result.write(Path(scratch)).values()
        for path in written:
            target.fs.put_file(str(path), target.path(path.name))
        return [target.child(path.name).url for path in written]
