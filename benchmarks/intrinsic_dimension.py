"""TwoNN against its limit, one blocked exact k-NN search, and against scikit-dimension.

Points: --points rows of a --manifold-dimensional Gaussian on a random linear subspace of R^--dim
plus isotropic noise of 0.01 (no duplicates), float64. Timed, side by side, median of --repeat:
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


def timed(function: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, value = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        value = function()
        times.append(time.perf_counter() - started)
    return statistics.median(times), value


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
    limit, _ = timed(lambda: nearest_neighbours(X, 2, device=args.device), args.repeat)
    rows.append(("limit: one 2-NN search", args.points, limit, None))
    ours, value = timed(lambda: twonn(X, device=args.device), args.repeat)
    rows.append(("lmgeom TwoNN", args.points, ours, value))
    if not args.skip_all:
        every, result = timed(lambda: intrinsic_dimension(X, n_boot=0, device=args.device), args.repeat)
        rows.append(("lmgeom all (64-NN)", args.points, every, result.get("twonn").dimension))
    small = X[: args.peer_points]
    ours_small, value_small = timed(lambda: twonn(small, device=args.device), args.repeat)
    rows.append(("lmgeom TwoNN", args.peer_points, ours_small, value_small))
    try:
        import skdim
    except ImportError:
        print("scikit-dimension not installed: pip install scikit-dimension==0.5")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peer, estimator = timed(lambda: skdim.id.TwoNN().fit(small), args.repeat)
        rows.append(("scikit-dimension TwoNN", args.peer_points, peer, estimator.dimension_))
    print(f"{'what':<26} {'points':>8} {'seconds':>9} {'x limit':>8} {'dimension':>10}")
    for name, n, seconds, dimension in rows:
        ratio = f"{seconds / limit:.2f}" if n == args.points else ""
        shown = "" if dimension is None else f"{dimension:.3f}"
        print(f"{name:<26} {n:>8,} {seconds:>9.2f} {ratio:>8} {shown:>10}")


if __name__ == "__main__":
    main()
