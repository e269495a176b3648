"""Whole analysis against one streaming read of the store, as the corpus grows (issues 11 and 12).

Each measured thing is a function in `MEASURES` that times one store in a fresh process (so its
peak RSS is its own) and returns a row:
- `read`: one streaming read of every layer (every row, as stored, in the analysis's chunks): the limit.
- `analysis-no-mev`: the streaming statistics of `analyze_store` (exact and sampled baselines,
  mean norm, SelfSim, IntraSim) over every layer, without MEV.
- `analysis`: `analyze_store` itself, MEV included (three variants, word groups of `--mev-memory-mb`),
  `--num-workers` layers at once (each in a worker process of its own; default 1: one process).
- `analysis-ray`: the same analysis as Ray tasks (`analyze_store(engine="ray")`, `--ray-workers` at once, tasks by
  row range and word group, states merged), on a local Ray cluster of `--ray-workers` CPUs that the
  child starts before its clock (or joins at RAY_ADDRESS).
The kinds alternate (read, no-mev, mev, ray, read, ...) `--repeat` times; the tables show the best
time of each, its ratio to the best read and the CPU time of the child and of the worker processes it
waited for (on a machine shared with other jobs the wall time follows their load; the CPU time much
less). Peak RSS, sampled every 50 ms while the clock runs, is the child's own and the sum over it and
every process it started (for Ray: its daemons and workers; for `--num-workers`: its workers).

`--shard-overhead` adds what the Ray path costs per extraction shard: a shard of synthetic vectors
(no model) written by a Ray actor against the same shard written in-process, alternating, so the
difference is dispatch, argument transfer and the actor's round trip, not encoding.

Stores are synthetic (`write_synthetic_store`): a built-in corpus's sentences repeated (Lee: 67k
words; STS: 531k), float32 rows = a shared offset + the word's centre + noise growing with depth.
Default sizes: the Lee corpus 1x, 10x, 30x at d = 768 and 1x, 10x at d = 4,096, one layer; and a
MiniLM-size store (STS, 7 layers x 384). The writer commits chunk by chunk, as
`write_store_from_arrays` does in one commit (which would hold the 6 GB of the 30x store in memory
three times). Each store is deleted after it is measured.

Run: python benchmarks/scale.py [--sizes lee:768:1,lee:768:10,...] [--kinds read,analysis,analysis-ray] [--num-workers 2]
[--shard-overhead]
Size: CORPUS:DIM:REPEAT[:LAYERS].
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import psutil

from lmgeom.corpus.corpus import Corpus, Sentence
from lmgeom.encoders.base import EncodedSentence
from lmgeom.store import RepresentationStore
from lmgeom.store.writer import StoreWriter

SENTENCES_PER_COMMIT = 2048


def corpus_words(name: str) -> list[list[str]]:
    """The words of each sentence of a built-in corpus (`lee`, `sts`)."""
    from lmgeom.corpus.builtin import load_corpus

    return [[word.text for word in sentence.words] for sentence in load_corpus(name).sentences]


def write_synthetic_store(path: str | Path, sentences: Sequence[Sequence[str]], *, dim: int, n_layers: int = 1,
                          seed: int = 0) -> RepresentationStore:
    """A store of `sentences` with seeded synthetic vectors: row = offset + centre[word] + noise,
    the noise growing with depth (so self-similarity falls with depth, as in real models)."""
    vocabulary = {word: index for index, word in enumerate(dict.fromkeys(w for words in sentences for w in words))}
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((len(vocabulary), dim), dtype=np.float32)
    offsets = rng.standard_normal((n_layers, dim), dtype=np.float32) * 3
    corpus = Corpus.from_list([list(words) for words in sentences], name="synthetic")
    settings = {"model_id": "synthetic", "n_layers": n_layers, "dim": dim, "pooling": "given", "special_tokens": "excluded",
                "dtype": "float32", "corpus_name": corpus.name, "corpus_fingerprint": corpus.fingerprint}
    writer = StoreWriter(path, settings=settings, overwrite=True)
    for first in range(0, len(sentences), SENTENCES_PER_COMMIT):
        chunk = sentences[first : first + SENTENCES_PER_COMMIT]
        ids = np.array([vocabulary[w] for words in chunk for w in words])
        layers = np.stack([offsets[layer] + centres[ids] + (0.5 + 0.25 * layer) * rng.standard_normal((len(ids), dim), dtype=np.float32)
                           for layer in range(n_layers)])
        encoded, row = [], 0
        for words in chunk:
            encoded.append(EncodedSentence(layers[:, row : row + len(words)], list(words), np.zeros(len(words), dtype=bool),
                                           np.ones(len(words), dtype=np.int16), 1))
            row += len(words)
        writer.commit(encoded, [s.text for s in corpus.sentences[first : first + SENTENCES_PER_COMMIT]])
    writer.finalize()
    return RepresentationStore.open(path)


# ---------------------------------------------------------------------------------------------
# what is measured, each in its own process


def _read(store: RepresentationStore) -> None:
    from lmgeom.engine.loop import stored_chunks

    for layer in store.layers:
        for _ in stored_chunks(store, layer, read_ahead=False):
            pass


def _analysis_without_mev(store: RepresentationStore) -> None:
    from lmgeom.engine import AnalysisOptions, run_analysis

    run_analysis(store, AnalysisOptions(statistics=("baseline", "norms", "sample", "self_similarity", "intra"),
                                        device=os.environ.get("LMGEOM_BENCH_DEVICE", "cpu")))


def _analysis(store: RepresentationStore, *, num_workers: int) -> None:
    from lmgeom.stages import analyze_store

    analyze_store(store, device=os.environ.get("LMGEOM_BENCH_DEVICE", "cpu"), num_workers=num_workers)


def _analysis_on_ray(store: RepresentationStore) -> None:
    from lmgeom.stages import analyze_store

    analyze_store(store, engine="ray", num_workers=RAY_WORKERS)


MEASURES: dict[str, Callable[..., None]] = {
    "read": _read,
    "analysis-no-mev": _analysis_without_mev,
    "analysis": _analysis,
    "analysis-ray": _analysis_on_ray,
}
RAY_WORKERS = int(os.environ.get("LMGEOM_BENCH_RAY_WORKERS", "2"))
LAYER_WORKER_KINDS = {"analysis"}  # the kinds that take --num-workers (analyze_store's own)


class PeakRss:
    """Largest resident memory of this process (`own`) and of it and all its descendants together
    (`total`), sampled every 50 ms. Not `ru_maxrss`: a child started by fork and exec keeps its
    parent's high-water mark, so it would report the parent's memory (the store writer's) as its own."""

    def __init__(self) -> None:
        self.own = 0
        self.total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            own = me.memory_info().rss
            total = own
            for process in me.children(recursive=True):
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    pass
            self.own, self.total = max(self.own, own), max(self.total, total)
            self._stop.wait(0.05)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def start_ray() -> Any:
    """Ray for a child: the cluster at RAY_ADDRESS, else a local one of `RAY_WORKERS` CPUs, with
    `RAY_WORKERS` task workers started and lmgeom imported in them (a warm cluster: a worker's
    start-up is paid once per cluster, not per analysis)."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
    else:
        ray.init(num_cpus=RAY_WORKERS, include_dashboard=False, configure_logging=False)
    # actors defined in this script: workers cannot import it by name
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.get([ray.remote(num_cpus=1)(_warm).remote() for _ in range(RAY_WORKERS)])
    return ray


def _warm() -> None:
    import lmgeom.stages.distributed  # noqa: F401

    time.sleep(1.0)  # hold the worker so the next warm-up task starts another one


def _cpu_seconds() -> float:
    """CPU time of this process (every thread) and of the child processes it has waited for (the
    analysis's worker processes, joined when their pool shuts down)."""
    spent = os.times()
    return spent.user + spent.system + spent.children_user + spent.children_system


def _child(kind: str, path: str, num_workers: int) -> None:
    import lmgeom.stages.analysis  # noqa: F401  (imported before the clock starts: every kind pays it alike)

    if kind.endswith("-ray"):
        start_ray()  # the cluster's start-up is not the analysis
    store = RepresentationStore.open(path)
    options = {"num_workers": num_workers} if kind in LAYER_WORKER_KINDS else {}
    with PeakRss() as everything:
        # a pool's start-up (spawning workers that import lmgeom) is on the clock: the analysis pays it
        started, cpu_started = time.perf_counter(), _cpu_seconds()
        MEASURES[kind](store, **options)
        seconds, cpu_seconds = time.perf_counter() - started, _cpu_seconds() - cpu_started
    print(json.dumps({"kind": kind, "num_workers": options.get("num_workers", 1), "seconds": seconds,
                      "cpu_seconds": cpu_seconds, "peak_rss_mb": everything.own / 2**20, "peak_rss_all_mb": everything.total / 2**20}))


def measure(kind: str, path: str | Path, *, num_workers: int = 1) -> dict[str, Any]:
    """One measurement in a fresh process: {"kind", "num_workers" (1 for the kinds without workers), "seconds",
    "cpu_seconds" (the child's own, every thread, and its worker processes': on a machine shared with other jobs
    it grows far less than the wall time), "peak_rss_mb", "peak_rss_all_mb"}."""
    done = subprocess.run([sys.executable, __file__, "--child", kind, str(path), "--num-workers", str(num_workers)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} on {path} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def store_rows(path: Path, *, kinds: Sequence[str], repeat: int, num_workers: int = 1) -> list[dict[str, Any]]:
    """The best of `repeat` alternating runs of each kind on one store, with its ratio to the read."""
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for _ in range(repeat):
        for kind in kinds:
            runs[kind].append(measure(kind, path, num_workers=num_workers))
            last = runs[kind][-1]
            print(f"  {kind}: {last['seconds']:.2f} s ({last['cpu_seconds']:.2f} s CPU), {last['peak_rss_mb']:.0f} MB ({last['peak_rss_all_mb']:.0f} MB with children)",
                  flush=True)
    best = {kind: min(results, key=lambda r: r["seconds"]) for kind, results in runs.items()}
    read = best.get("read")
    return [{**best[kind], "all_seconds": [r["seconds"] for r in runs[kind]], "all_cpu_seconds": [r["cpu_seconds"] for r in runs[kind]],
             "ratio_to_read": best[kind]["seconds"] / read["seconds"] if read else None} for kind in kinds]


# ---------------------------------------------------------------------------------------------
# the Ray path's cost per extraction shard


class SyntheticEncoder:
    """Seeded random vectors (13 layers x 768): encoding costs the same nothing on both sides."""

    def __init__(self, n_layers: int = 13, dim: int = 768) -> None:
        self.model_id, self.n_layers, self.dim = "synthetic", n_layers, dim
        self.rng = np.random.default_rng(0)

    def settings(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "n_layers": self.n_layers, "dim": self.dim}

    def encode(self, sentences: Sequence[Sentence], *, first_index: int = 0) -> list[EncodedSentence]:
        return [EncodedSentence(self.rng.standard_normal((self.n_layers, len(s.words), self.dim), dtype=np.float32),
                                [word.text for word in s.words], np.zeros(len(s.words), dtype=bool),
                                np.ones(len(s.words), dtype=np.int16), 1) for s in sentences]


class ShardCall:
    """A Ray actor writing a shard of synthetic vectors, as `ShardWorker` does with a model."""

    def __init__(self) -> None:
        self.encoder = SyntheticEncoder()

    def call(self, url: str, settings: dict[str, Any], sentences: Sequence[Sentence]) -> dict[str, Any]:
        from lmgeom.stages.distributed import encode_shard

        return encode_shard(self.encoder, url, settings, 0, 0, sentences)


def _shard_overhead_child(repeats: int, sentences: int = 32) -> None:
    from lmgeom.corpus import load_corpus
    from lmgeom.stages.distributed import encode_shard

    ray = start_ray()
    shard = load_corpus("lee", limit=sentences).sentences
    encoder = SyntheticEncoder()
    settings = {**encoder.settings(), "dtype": "float32", "chunk_sentences": sentences}
    actor = ray.remote(ShardCall).options(num_cpus=1).remote()
    times: dict[str, list[float]] = {"local": [], "ray": []}
    with tempfile.TemporaryDirectory() as scratch:
        ray.get(actor.call.remote(f"{scratch}/warm", settings, shard))  # the actor's start-up is not a shard's cost
        for attempt in range(repeats):
            for side in times:
                out = f"{scratch}/{side}-{attempt}"
                started = time.perf_counter()
                if side == "local":
                    encode_shard(encoder, out, settings, 0, 0, shard)
                else:
                    ray.get(actor.call.remote(out, settings, shard))
                times[side].append(time.perf_counter() - started)
                shutil.rmtree(out)
    print(json.dumps({"sentences": sentences, "rows": sum(len(s.words) for s in shard), "layers": encoder.n_layers,
                      "dim": encoder.dim, "local": times["local"], "ray": times["ray"]}))


def shard_overhead(repeats: int) -> dict[str, Any]:
    """Median seconds of one shard written in-process and by an actor (fresh process), and every time."""
    done = subprocess.run([sys.executable, __file__, "--shard-overhead-child", str(repeats)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"shard overhead failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


# ---------------------------------------------------------------------------------------------


def _size(spec: str) -> tuple[str, int, int, int]:
    corpus, dim, repeat, *layers = spec.split(":")
    return corpus, int(dim), int(repeat), int(layers[0]) if layers else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="lee:768:1,lee:768:10,lee:768:30,lee:4096:1,lee:4096:10,sts:384:1:7")
    parser.add_argument("--kinds", default="read,analysis-no-mev,analysis", help=f"any of {', '.join(MEASURES)}")
    parser.add_argument("--no-mev-above-dim", type=int, default=1024,
                        help="leave the MEV row out above this d (its dense d x d eigenproblems take hours until MEV is matrix-free)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--num-workers", type=int, default=1,
                        help="the analysis kind: layers analysed at once, each in a worker process (analyze_store's num_workers)")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores are written (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=None, help="also write every row to this JSON file")
    parser.add_argument("--store", type=Path, default=None, help="measure this existing store instead (kept)")
    parser.add_argument("--shard-overhead", action="store_true", help="also measure the Ray path's cost per extraction shard")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--shard-overhead-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child, num_workers=args.num_workers)
        return
    if args.shard_overhead_child:
        _shard_overhead_child(args.shard_overhead_child)
        return
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(), flush=True)
    rows: list[dict[str, Any]] = []
    if args.store:
        store = RepresentationStore.open(args.store)
        rows += [{"size": str(args.store), "corpus": store.path.name, "repeat": 1, "rows": store.n_tokens, "dim": store.dim,
                 "layers": len(store.layers), "store_gb": store.n_tokens * store.dim * len(store.layers) * 4 / 1e9, **row}
                for row in store_rows(args.store, kinds=args.kinds.split(","), repeat=args.repeat, num_workers=args.num_workers)]
        print_table(rows)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=1))
        return

    words = {}
    base = Path(tempfile.mkdtemp(dir=args.dir, prefix="lmgeom-scale-"))
    try:
        for spec in args.sizes.split(","):
            corpus, dim, repeat, n_layers = _size(spec)
            if corpus not in words:
                words[corpus] = corpus_words(corpus)
            path = base / spec.replace(":", "-")
            started = time.perf_counter()
            store = write_synthetic_store(path, words[corpus] * repeat, dim=dim, n_layers=n_layers)
            print(f"{spec}: {store.n_tokens:,} rows x {dim} x {n_layers} layers written in {time.perf_counter() - started:.0f} s", flush=True)
            kinds = [k for k in args.kinds.split(",") if not (k == "analysis" and dim > args.no_mev_above_dim)]
            for row in store_rows(path, kinds=kinds, repeat=args.repeat, num_workers=args.num_workers):
                rows.append({"size": spec, "corpus": corpus, "repeat": repeat, "rows": store.n_tokens, "dim": dim,
                             "layers": n_layers, "store_gb": store.n_tokens * dim * n_layers * 4 / 1e9, **row})
            shutil.rmtree(path)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    overhead = shard_overhead(5 * args.repeat) if args.shard_overhead else None
    print_table(rows, overhead)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "shard_overhead": overhead}, indent=1))


def print_table(rows: list[dict[str, Any]], overhead: dict[str, Any] | None = None) -> None:
    print(f"\n{os.cpu_count()} CPUs; {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}\n")
    print("| store | rows | d x layers | GB | measured | best s (all) | x read | CPU s, with workers (all) | peak RSS MB (with children) |")
    print("|---|---:|---|---:|---|---:|---:|---:|---:|")
    for row in rows:
        runs = ", ".join(f"{s:.1f}" for s in row["all_seconds"])
        cpu = ", ".join(f"{s:.1f}" for s in row["all_cpu_seconds"])
        ratio = "" if row["ratio_to_read"] is None else f"{row['ratio_to_read']:.1f}"
        measured = row["kind"] if row["num_workers"] == 1 else f"{row['kind']}, {row['num_workers']} workers"
        print(f"| {row['corpus']} x{row['repeat']} | {row['rows']:,} | {row['dim']} x {row['layers']} | {row['store_gb']:.1f} | "
              f"{measured} | {row['seconds']:.1f} ({runs}) | {ratio} | {row['cpu_seconds']:.1f} ({cpu}) | "
              f"{row['peak_rss_mb']:,.0f} ({row['peak_rss_all_mb']:,.0f}) |")
    if overhead:
        local, ray = statistics.median(overhead["local"]), statistics.median(overhead["ray"])
        print(f"\none shard of {overhead['sentences']} sentences ({overhead['rows']} rows x {overhead['layers']} layers x "
              f"{overhead['dim']}, synthetic vectors), median of {len(overhead['local'])}: in-process {local:.3f} s, "
              f"Ray actor {ray:.3f} s; the Ray path's overhead per shard {ray - local:.3f} s")


if __name__ == "__main__":
    main()
