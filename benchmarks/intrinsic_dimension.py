"""TwoNN against its limit, one blocked exact k-NN search, and against scikit-dimension.

Points: --points rows of a --manifold-dimensional Gaussian on a random linear subspace of R^--dim
plus isotropic noise of 0.01 (no duplicates), float64. Timed one after the other in one process,
wall and CPU seconds (one thread: CPU seconds carry over to another machine and ignore other load),
median of --repeat:
- `limit`: `lmgeom.metrics.intrinsic.nearest_neighbours(X, 2)`, one blocked exact k-NN search;
- `lmgeom TwoNN`: `twonn(X)`: duplicates removed, that search, the fit (goal: <= 2x the limit);
- `lmgeom all`: `intrinsic_dimension(X, n_boot=0)`: TwoNN, MLE (k = 20) and GRIDE up to n2 = 64 from one 64-NN search;
- `scikit-dimension TwoNN` (`skdim.id.TwoNN().fit`, chunked pairwise distances for dim > 25) and
  lmgeom's TwoNN at --peer-points, the size the peer is run at.

Run: nice -n 19 python benchmarks/intrinsic_dimension.py [--points 100000] [--dim 384] [--peer-points 10000] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any, Callable

import numpy as np

from lmgeom.metrics.intrinsic import intrinsic_dimension, nearest_neighbours, twonn


def points(n: int, dim: int, manifold: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.normal(size=(dim, manifold)))[0]
    return rng.normal(size=(n, manifold)) @ basis.T + 0.01 * rng.normal(size=(n, dim))


def timed(function: Callable[[], Any], repeat: int) -> tuple[float, float, Any]:
    """(median wall seconds, median CPU seconds of this process, the last value)."""
    walls, cpus, value = [], [], None
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        value = function()
        walls.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--manifold", type=int, default=10)
    parser.add_argument("--peer-points", type=int, default=10_000)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--skip-all", action="store_true", help="leave out the 64-NN run of every estimator")
    args = parser.parse_args()
    X = points(args.points, args.dim, args.manifold)
    rows = []
    nearest_neighbours(X[:100], 2, device=args.device)  # torch's first call (thread pool, kernels) is not timed
    limit = timed(lambda: nearest_neighbours(X, 2, device=args.device), args.repeat)
    rows.append(("limit: one 2-NN search", args.points, *limit[:2], None))
    ours = timed(lambda: twonn(X, device=args.device), args.repeat)
    rows.append(("lmgeom TwoNN", args.points, *ours))
    if not args.skip_all:
        every = timed(lambda: intrinsic_dimension(X, n_boot=0, device=args.device), args.repeat)
        rows.append(("lmgeom all (64-NN)", args.points, *every[:2], every[2].get("twonn").dimension))
    small = X[: args.peer_points]
    rows.append(("lmgeom TwoNN", args.peer_points, *timed(lambda: twonn(small, device=args.device), args.repeat)))
    try:
        import skdim
    except ImportError:
        print("scikit-dimension not installed: pip install scikit-dimension==0.5")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wall, cpu, estimator = timed(lambda: skdim.id.TwoNN().fit(small), args.repeat)
        rows.append(("scikit-dimension TwoNN", args.peer_points, wall, cpu, estimator.dimension_))
    print(f"{'what':<26} {'points':>8} {'wall s':>8} {'CPU s':>8} {'x limit (CPU)':>14} {'dimension':>10}")
    for name, n, wall, cpu, dimension in rows:
        ratio = f"{cpu / limit[1]:.2f}" if n == args.points else ""
        shown = "" if dimension is None else f"{dimension:.3f}"
        print(f"{name:<26} {n:>8,} {wall:>8.2f} {cpu:>8.2f} {ratio:>14} {shown:>10}")


if __name__ == "__main__":
    main()
