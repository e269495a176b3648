"""`mev(X, ids, variant=...)` for each single variant against all three at once and one norm pass.

The data: 80,000 float64 occurrences at d = 4,096 (2.6 GB), 20 words x 3,000 rows + 2,000 words x 10
rows, every row Gaussian + 0.5 (seeded; words assigned to rows in a shuffled order). There the
uncentred problem of a frequent word has a wide gap (the mean direction holds about 0.25 d n of the
energy, the Marchenko-Pastur bulk tops out at (sqrt(n) + sqrt(d))^2), while the centred one is a
flat Marchenko-Pastur spectrum, the hard case for block Lanczos.

Timed, round-robin (norm pass, mev per variant, all three; median of --repeats), in wall-clock
seconds and in CPU seconds of this process (one thread: on a shared machine the CPU time is what the
work costs, the wall time adds the waits for a core):
- norm pass: `np.sqrt(np.einsum("ij,ij->i", X, X))` (one read of X, no temporary);
- `mev(X, ids, variant=v)` for v in MEV_VARIANTS: the array-level function (grouping copy and solve);
- all three: `MEVAccumulator(...).add(X, word_ids=ids).result()` and the three values of each
  spectrum, what `lmgeom analyze` computes.
Also counted: the block Lanczos products spent on the rows of frequent words, the frequent words
whose Lanczos gave up for the dense route (their spectrum too flat for the budget), and the largest
relative difference of each single variant from the all-variant solve.

Run with one thread (the spectrum code pins BLAS to one thread itself; this pins the rest):
    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 PYTHONPATH=$PWD/src python benchmarks/mev_variants.py
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any, Callable

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from lmgeom.metrics import MEV_VARIANTS, MEVAccumulator, mev
from lmgeom.metrics import spectrum as spectrum_module


def make_occurrences(dim: int, counts: np.ndarray, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian + 0.5 float64 rows and word ids (word i has counts[i] rows), ids in shuffled order."""
    rng = np.random.default_rng(seed)
    word_ids = rng.permutation(np.repeat(np.arange(len(counts)), counts))
    X = np.empty((len(word_ids), dim))
    step = 4096
    for start in range(0, len(X), step):  # filled in place: no second full-size array
        rng.standard_normal(out=X[start:start + step])
    X += 0.5
    return X, word_ids


def all_variants(X: np.ndarray, word_ids: np.ndarray) -> dict[str, pd.Series]:
    """The three variants of every word from one accumulator (what the full analysis runs)."""
    labels, inverse = np.unique(word_ids, return_inverse=True)
    accumulator = MEVAccumulator(len(labels), expected_counts=np.bincount(inverse, minlength=len(labels)))
    spectra = accumulator.add(X, word_ids=inverse).result()
    words = [word for word, spectrum in spectra.items() if spectrum.n >= 2]
    return {variant: pd.Series([spectra[word].mev(variant) for word in words], index=labels[words], dtype=np.float64)
            for variant in MEV_VARIANTS}


class Counters:
    """Block Lanczos products on row-held words and the Lanczos solves that gave up, while installed."""

    def __init__(self) -> None:
        self.products = 0
        self.gave_up = 0
        self._originals: tuple[Any, Any] | None = None

    def install(self) -> None:
        images, krylov = spectrum_module._ChunkedRows.scatter_images, spectrum_module._krylov_rows_spectrum
        self._originals = (images, krylov)

        def counted_images(rows: Any, block: np.ndarray, dtype: Any) -> np.ndarray:
            self.products += block.shape[1]
            return images(rows, block, dtype)

        def counted_krylov(*args: Any, **kwargs: Any) -> Any:
            result = krylov(*args, **kwargs)
            self.gave_up += result is None
            return result

        spectrum_module._ChunkedRows.scatter_images = counted_images  # type: ignore[method-assign]
        spectrum_module._krylov_rows_spectrum = counted_krylov

    def take(self) -> tuple[int, int]:
        counts = (self.products, self.gave_up)
        self.products = self.gave_up = 0
        return counts


def timed(call: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds of this process, value) of `call()`."""
    start, cpu = time.perf_counter(), time.process_time()
    value = call()
    return time.perf_counter() - start, time.process_time() - cpu, value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--frequent", type=int, default=20)
    parser.add_argument("--frequent-n", type=int, default=3000)
    parser.add_argument("--rare", type=int, default=2000)
    parser.add_argument("--rare-n", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    counts = np.array([args.frequent_n] * args.frequent + [args.rare_n] * args.rare)
    X, word_ids = make_occurrences(args.dim, counts)
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"{args.frequent} x {args.frequent_n} + {args.rare} x {args.rare_n} Gaussian + 0.5 float64 rows at d = {args.dim} "
          f"({X.nbytes / 1e9:.2f} GB); OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"one BLAS thread; median of {args.repeats}")
    counters = Counters()
    counters.install()
    cases: dict[str, Callable[[], Any]] = {"norm pass": lambda: np.sqrt(np.einsum("ij,ij->i", X, X))}
    for variant in MEV_VARIANTS:
        cases[f"mev {variant}"] = lambda variant=variant: {variant: mev(X, word_ids, variant=variant)}
    cases["all three"] = lambda: all_variants(X, word_ids)
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu_times: dict[str, list[float]] = {name: [] for name in cases}
    effort: dict[str, tuple[int, int]] = {}
    values: dict[str, dict[str, pd.Series]] = {}
    with threadpool_limits(limits=1):
        for _ in range(args.repeats):
            for name, call in cases.items():
                counters.take()
                elapsed, cpu, value = timed(call)
                times[name].append(elapsed)
                cpu_times[name].append(cpu)
                effort[name] = counters.take()
                values[name] = value
    norm, norm_cpu = float(np.median(times["norm pass"])), float(np.median(cpu_times["norm pass"]))
    reference = values["all three"]
    print(f"{'case':<16} {'wall s':>8} {'x norm':>7} {'CPU s':>8} {'x norm':>7} {'wall runs (s)':<22} "
          f"{'products':>9} {'gave up':>8} {'max rel diff to all':>20}")
    for name, elapsed in times.items():
        median, cpu = float(np.median(elapsed)), float(np.median(cpu_times[name]))
        runs = ", ".join(f"{t:.2f}" for t in elapsed)
        line = f"{name:<16} {median:>8.3f} {median / norm:>7.1f} {cpu:>8.3f} {cpu / norm_cpu:>7.1f} {runs:<22}"
        if name != "norm pass":
            products, gave_up = effort[name]
            diffs = [float(np.nanmax(np.abs(series / reference[variant].loc[series.index] - 1)))
                     for variant, series in values[name].items()]
            line += f" {products:>9} {gave_up:>8} {max(diffs):>20.1e}"
        print(line)
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
