"""Local engine against Ray with 2 workers on this machine, and what the Ray path costs per shard.

`ray_rows()` returns rows (dicts) in the shape of benchmarks/scale.py's (benchmark, engine, size,
seconds, peak RSS), to be joined with them:
1. analysis of one layer of a synthetic store (`rows` x `dim`, Zipf-distributed words): one
   `analyze_store` pass against `analyze_ray` (tasks by row range and word group, states merged);
2. extraction of `sentences` Lee sentences with tiny-bert: `extract` against `extract_sharded` on
   2 Ray actors;
3. the Ray path's overhead per shard: a shard of synthetic vectors (no model) written by an actor
   against the same shard written in this process, so the difference is dispatch, argument
   transfer and the actor's round trip, not encoding.
The two sides alternate (local, ray, local, ray, ...) and each row keeps the median of `repeats`,
every time and the machine load (`uptime`). Ray starts once, first, and its start-up time is a row
of its own. Peak RSS is the largest sampled resident memory of this process and every process it
started (Ray's raylet, GCS and workers included), so the Ray rows carry Ray's own daemons.

    python benchmarks/scale_ray.py [--rows 20000] [--dim 768] [--sentences 192] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import psutil

from lmgeom.corpus import load_corpus
from lmgeom.corpus.corpus import Sentence
from lmgeom.encoders.base import EncodedSentence
from lmgeom.encoders.registry import load_encoder
from lmgeom.runs import extract
from lmgeom.runs.analysis import AnalysisOptions, analyze_store
from lmgeom.runs.distributed import analyze_ray, connect_ray, encode_shard, extract_sharded
from lmgeom.store import write_store_from_arrays


class _PeakRss:
    """Largest resident memory of this process and its descendants, sampled every 50 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for process in [me, *me.children(recursive=True)]:
                try:
                    total += process.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.05)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _measure(run: Callable[[], object]) -> tuple[float, float]:
    with _PeakRss() as rss:
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
    return seconds, rss.peak / 2**20


def _alternate(sides: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[tuple[float, float]]]:
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for _ in range(repeats):
        for name, run in sides.items():
            runs[name].append(_measure(run))
    return runs


def _rows(benchmark: str, runs: dict[str, list[tuple[float, float]]], load: str, *, ray_workers: int = 2,
          **size: Any) -> list[dict[str, Any]]:
    return [{"benchmark": benchmark, "engine": engine, "workers": ray_workers if engine == "ray" else 1, **size,
             "seconds": statistics.median(t for t, _ in measured), "seconds_all": [round(t, 3) for t, _ in measured],
             "peak_rss_mb": max(m for _, m in measured), "load": load} for engine, measured in runs.items()]


def _synthetic_store(path: Path, rows: int, dim: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words_per_sentence = 25
    vocabulary = np.array([f"w{i}" for i in range(max(50, rows // 20))])
    ranks = np.minimum(rng.zipf(1.3, size=rows), len(vocabulary)) - 1
    X = (rng.standard_normal((rows, dim)) + 2.0 * rng.standard_normal(dim)).astype(np.float32)
    words = vocabulary[ranks].tolist()
    write_store_from_arrays(path, [X], [words[i : i + words_per_sentence] for i in range(0, rows, words_per_sentence)])


class _SyntheticEncoder:
    """Random vectors for the shard-overhead row: the cost of encoding is left out on both sides."""

    def __init__(self, n_layers: int = 13, dim: int = 768) -> None:
        self.model_id, self.n_layers, self.dim = "synthetic", n_layers, dim
        self.rng = np.random.default_rng(0)

    def settings(self) -> dict[str, Any]:
        return {"model_id": self.model_id, "n_layers": self.n_layers, "dim": self.dim}

    def encode(self, sentences: Sequence[Sentence], *, first_index: int = 0) -> list[EncodedSentence]:
        return [EncodedSentence(self.rng.standard_normal((self.n_layers, len(s.words), self.dim)).astype(np.float32),
                                [word.text for word in s.words], np.zeros(len(s.words), dtype=bool),
                                np.ones(len(s.words), dtype=np.int16), 1) for s in sentences]


def ray_rows(*, rows: int = 20000, dim: int = 768, sentences: int = 192, repeats: int = 3) -> list[dict[str, Any]]:
    """The local-vs-Ray rows (see the module docstring)."""
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    started = time.perf_counter()
    ray = connect_ray(None) if os.environ.get("RAY_ADDRESS") else _start_local_ray()
    table = [{"benchmark": "ray start-up", "engine": "ray", "workers": 2, "seconds": time.perf_counter() - started, "load": load}]
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        _synthetic_store(root / "synthetic", rows, dim)
        options = AnalysisOptions(min_contexts=2, layers=(0,))
        table += _rows("analysis, one layer", _alternate({
            "local": lambda: analyze_store(root / "synthetic", min_contexts=2, layers=[0]),
            "ray": lambda: analyze_ray(str(root / "synthetic"), options, num_workers=2),
        }, repeats), load, rows=rows, dim=dim)

        corpus = load_corpus("lee", limit=sentences)
        encoder = load_encoder("tiny-bert", device="cpu")
        counter = iter(range(10**6))
        table += _rows("extraction, tiny-bert", _alternate({
            "local": lambda: extract(encoder, corpus, root / f"local-{next(counter)}", chunk_sentences=32),
            "ray": lambda: extract_sharded(partial(load_encoder, "tiny-bert", device="cpu"), corpus, root / f"ray-{next(counter)}",
                                           engine="ray", num_workers=2, chunk_sentences=32),
        }, repeats), load, sentences=sentences)

        synthetic = _SyntheticEncoder()
        shard = corpus.sentences[:32]
        settings = {**synthetic.settings(), "dtype": "float32", "chunk_sentences": 32}
        worker = ray.remote(_ShardCall).options(num_cpus=1).remote()
        ray.get(worker.call.remote(str(root / "warm"), settings, shard))
        in_process = _alternate({
            "local": lambda: encode_shard(synthetic, str(root / f"shard-{next(counter)}"), settings, 0, 0, shard),
            "ray": lambda: ray.get(worker.call.remote(str(root / f"shard-{next(counter)}"), settings, shard)),
        }, 5 * repeats)
        shard_rows = _rows("one shard of 32 sentences, 13 x 768 synthetic vectors", in_process, load, ray_workers=1,
                           sentences=len(shard), tokens=sum(len(s.words) for s in shard))
        local, remote = (row["seconds"] for row in shard_rows)
        table += shard_rows + [{"benchmark": "ray overhead per shard", "engine": "ray", "workers": 1,
                                "seconds": remote - local, "load": load}]
    return table


class _ShardCall:
    """An actor writing a shard of synthetic vectors, as `ShardWorker` does with a model."""

    def __init__(self) -> None:
        self.encoder = _SyntheticEncoder()

    def call(self, url: str, settings: dict[str, Any], sentences: Sequence[Sentence]) -> dict[str, Any]:
        return encode_shard(self.encoder, url, settings, 0, 0, sentences)


def _start_local_ray() -> Any:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    # the shard-overhead actor is defined here; workers cannot import this script by name
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return ray


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--sentences", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for row in ray_rows(rows=args.rows, dim=args.dim, sentences=args.sentences, repeats=args.repeats):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
