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

The analysis of a store on Ray is the analysis engine's `RayExecutor` (`lmgeom.engine`).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, replace
from functools import partial
from types import ModuleType
from typing import Any, Callable, Container, Iterable, Iterator, Sequence, cast

from lmgeom.engine.ray import connect_ray
from lmgeom.errors import InputError
from lmgeom.corpus.builtin import open_corpus
from lmgeom.corpus.corpus import Corpus, CorpusStream, CorpusSummary, Fingerprint, Sentence
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.options import EncoderOptions
from lmgeom.progress import NoProgress, Progress
from lmgeom import rundir
from lmgeom.stages.extraction_options import ExtractionOptions
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


def resolve_shards(options: ExtractionOptions, n_layers: int, dim: int, n_sentences: int, *,
                   num_workers: int = 1) -> ExtractionOptions:
    """`options.resolve` for the sharded engine, with `shard_sentences` filled in: by default a shard is
    `default_shard_sentences` (in whole chunks) and its sort window the whole shard, or as many whole
    chunks of it as the memory budget holds (`default_sort_window`); a shard is whole windows (its size
    is rounded up to one), so shard windows are the windows a local run with that `sort_window` cuts and
    the stored vectors are the local engine's. Windows never cross a shard: a shard is encoded, committed
    and redone on its own."""
    resolved = options.resolve(n_layers, dim, n_sentences)  # the local engine's window: the memory budget's
    chunk = int(resolved.chunk_sentences or 0)
    shard = options.shard_sentences or default_shard_sentences(n_sentences, chunk, num_workers=num_workers)
    window = options.sort_window or min(int(resolved.sort_window or 0), -(-shard // chunk) * chunk)
    if shard % window:  # a shard is whole windows, as a local run cuts them
        shard += window - shard % window
    return replace(resolved, sort_window=window, shard_sentences=shard)


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

    def layer_note(self) -> str:
        return str(getattr(self.encoder, "layer_note", layout.LAYER_NOTE))

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
    `shard_sentences` and `sort_window` as `resolve_shards` says (each shard sorted by length as a
    whole, where the memory budget allows; a resumed run keeps its own). With
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
        layer_note = ray.get(workers[0].layer_note.remote())
    else:
        encoder = cast(Encoder, make_encoder) if hasattr(make_encoder, "encode") else cast(EncoderFactory, make_encoder)()
        encoder_settings = encoder.settings()
        layer_note = str(getattr(encoder, "layer_note", layout.LAYER_NOTE))
    if not overwrite and location.exists(layout.META):
        # a resumed run keeps its shards (whatever the number of workers now), chunks and windows
        recorded = location.read_json(layout.META).get("settings", {})
        if recorded.get("chunk_sentences") and options.chunk_sentences in (None, recorded["chunk_sentences"]):
            options = replace(options, chunk_sentences=recorded["chunk_sentences"],
                              sort_window=options.sort_window or recorded.get("sort_window") or recorded["chunk_sentences"],
                              shard_sentences=options.shard_sentences or recorded.get("shard_sentences"))
    options = resolve_shards(options, int(encoder_settings["n_layers"]), int(encoder_settings["dim"]), summary.n_sentences,
                             num_workers=num_workers)
    settings = store_settings(encoder_settings, source, summary, options)
    with ShardedStoreWriter(location, settings=settings, overwrite=overwrite, foreign=rundir.foreign_entries,
                            layer_note=layer_note) as writer:  # its lock is released however this ends
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

