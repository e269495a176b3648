"""TwoNN and the MLE against their limit, one blocked exact k-NN search of the same points, and
against scikit-dimension, side by side in one run.

Points: --points rows of a --manifold-dimensional Gaussian on a random linear subspace of R^--dim
plus isotropic noise of 0.01 (no duplicates), float64. Timed one after the other in one process,
wall and CPU seconds (BLAS and torch on one thread: CPU seconds carry over to another machine and
ignore other load) and the peak resident memory of each step (the process's high-water mark, reset
before each step: Linux's /proc/self/clear_refs), median of --repeat:
- `limit: 2-NN` / `limit: 20-NN`: `lmgeom.metrics.intrinsic.nearest_neighbours(X, k)`, one blocked
  exact k-NN search (what any exact TwoNN, or MLE with k = 20, must do);
- `lmgeom TwoNN`: `twonn(X)`: duplicates removed, that search, the fit (goal: <= 2x its limit);
- `lmgeom MLE`: `mle(X)`: duplicates removed, the 20-NN search, the estimate (goal: <= 2x its limit);
- `lmgeom all` (unless --skip-all): `intrinsic_dimension(X, n_boot=0)`: TwoNN, MLE and GRIDE to n2 = 64 from one 64-NN search;
- at --peer-points (the size scikit-dimension runs at in minutes: it sorts each full row of its
  chunked n x n distance matrix), lmgeom's TwoNN and MLE and `skdim.id.TwoNN().fit`,
  `skdim.id.MLE(K=20).fit` on the same points.

Run: nice -n 19 python benchmarks/intrinsic_dimension.py [--points 100000] [--dim 384] [--peer-points 10000] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from lmgeom.metrics.intrinsic import MLE_NEIGHBOURS, intrinsic_dimension, mle, nearest_neighbours, twonn


def points(n: int, dim: int, manifold: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(dim, manifold)))[0]
    return rng.normal(size=(n, manifold)) @ basis.T + 0.01 * rng.normal(size=(n, dim))


def _peak_rss_mb(reset: bool = False) -> float:
    """This process's peak resident memory in MB since the last reset (Linux; NaN elsewhere)."""
    status, refs = Path("/proc/self/status"), Path("/proc/self/clear_refs")
    if reset and refs.exists():
        try:
            refs.write_text("5")  # resets VmHWM to the current resident size
        except OSError:
            pass
    if not status.exists():
        return float("nan")
    line = next(line for line in status.read_text().splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def timed(function: Callable[[], Any], repeat: int) -> tuple[float, float, float, Any]:
    """(median wall seconds, median CPU seconds of this process, peak memory MB, the last value)."""
    walls, cpus, peaks, value = [], [], [], None
    for _ in range(repeat):
        _peak_rss_mb(reset=True)
        started, cpu = time.perf_counter(), time.process_time()
        value = function()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
        peaks.append(_peak_rss_mb())
    return statistics.median(walls), statistics.median(cpus), max(peaks), value


def peers(small: np.ndarray, measure: Callable[..., float]) -> None:
    """scikit-dimension's TwoNN and MLE on the same points, where it is installed."""
    try:
        import skdim
    except ImportError:
        print("scikit-dimension not installed: pip install scikit-dimension==0.5")
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measure("scikit-dimension TwoNN", len(small), lambda: float(skdim.id.TwoNN().fit(small).dimension_))
        measure(f"scikit-dimension MLE (K = {MLE_NEIGHBOURS})", len(small),
                lambda: float(skdim.id.MLE(K=MLE_NEIGHBOURS).fit(small).dimension_))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--manifold", type=int, default=10)
    parser.add_argument("--peer-points", type=int, default=10_000, help="0: no run at the peer's size")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--skip-all", action="store_true", help="leave out the 64-NN run of every estimator")
    args = parser.parse_args()
    torch.set_num_threads(1)
    X = points(args.points, args.dim, args.manifold)
    small = X[: args.peer_points]
    rows: list[tuple[str, int, float, float, float, float | None, float | None]] = []
    nearest_neighbours(X[:100], 2, device=args.device)  # torch's first call (thread pool, kernels) is not timed

    def measure(name: str, n: int, function: Callable[[], Any], limit: float | None = None) -> float:
        wall, cpu, peak, value = timed(function, args.repeat)
        dimension = float(value) if isinstance(value, float) else None
        rows.append((name, n, wall, cpu, peak, None if limit is None else cpu / limit, dimension))
        print(f"  {name} ({n:,} points): {cpu:.1f} CPU s, {wall:.1f} s wall, peak {peak:.0f} MB"
              + ("" if dimension is None else f", dimension {dimension:.3f}"), flush=True)
        return cpu

    with threadpool_limits(limits=1):
        # the peer's size first (minutes), then --points (the n^2 search: the long part)
        for n, data in ([(args.peer_points, small)] if args.peer_points else []) + [(args.points, X)]:
            limit_2 = measure("limit: one 2-NN search", n, lambda: nearest_neighbours(data, 2, device=args.device) and None)
            measure("lmgeom TwoNN", n, lambda: twonn(data, device=args.device), limit_2)
            limit_20 = measure(f"limit: one {MLE_NEIGHBOURS}-NN search", n,
                               lambda: nearest_neighbours(data, MLE_NEIGHBOURS, device=args.device) and None)
            measure(f"lmgeom MLE (k = {MLE_NEIGHBOURS})", n, lambda: mle(data, device=args.device), limit_20)
            if n == args.peer_points:
                peers(small, measure)
            elif not args.skip_all:
                measure("lmgeom all (64-NN)", n, lambda: intrinsic_dimension(data, n_boot=0, device=args.device).get("twonn").dimension)
    print(f"\nd = {args.dim}, a {args.manifold}-dimensional Gaussian plus noise; device {args.device}; "
          f"{os.cpu_count()} CPUs, one thread")
    print(f"{'what':<30} {'points':>8} {'wall s':>8} {'CPU s':>8} {'peak MB':>8} {'x limit':>8} {'dimension':>10}")
    for name, n, wall, cpu, peak, ratio, dimension in rows:
        shown = "" if dimension is None else f"{dimension:.3f}"
        print(f"{name:<30} {n:>8,} {wall:>8.2f} {cpu:>8.2f} {peak:>8.0f} {'' if ratio is None else f'{ratio:.2f}':>8} {shown:>10}")


if __name__ == "__main__":
    main()
