"""MEV at LLM width: per-word spectra matrix-free against one pass computing the row norms of X.

The case of issue 11: 80,000 occurrences (20 words x 3,000 + 2,000 words x 10), float32, at
d = 768, 2,048, 4,096. Rows are anisotropic like a real layer (one dominant common direction, a
decaying low-rank spread per word, isotropic noise) or, with --spectrum flat, Gaussian (the hardest
case for Krylov methods: small relative gaps at the top of a Marchenko-Pastur spectrum).

Timed, interleaved (norm pass, MEV, norm pass, MEV, ...; best of --repeats), one BLAS thread:
- norm pass: `np.sqrt(np.einsum("ij,ij->i", X, X))` on the float32 X (one read of X, no temporary);
- `np.linalg.norm(X, axis=1)`: the same row norms as numpy's idiom computes them (it squares X into a
  temporary first), the yardstick of the issue's measurement (0.5-1.5 s at d = 4,096 there);
- matrix-free: `MEVAccumulator(...).add(X, word_ids=...).result()`, every variant (what `lmgeom analyze` runs):
  the float32 rows grouped by word in one copy, float32 block Lanczos refined in float64;
- dense (before): the previous algorithm, two n x n Gram matrices and two `eigh` per word (n <= d),
  timed on --dense-words frequent words and all rare words and extrapolated to all frequent words.
Errors: max relative error against that dense reference, over the words it ran on, of the top
eigenvalues and MEV values (uncentred, centred), and of the directions (|v - v_dense|) and svd_ratio.

Run: python benchmarks/mev.py [--dims 768,2048,4096] [--spectrum anisotropic|flat] [--dense-words 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Any

import numpy as np
from scipy.linalg import eigh
from threadpoolctl import threadpool_limits

from lmgeom.metrics import MEVAccumulator
from lmgeom.metrics.spectrum import OccurrenceSpectrum


def make_occurrences(dim: int, *, frequent: int, frequent_n: int, rare: int, rare_n: int, spectrum: str,
                     seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """float32 rows and word ids (frequent words first), rows in a shuffled corpus order."""
    rng = np.random.default_rng(seed)
    counts = np.array([frequent_n] * frequent + [rare_n] * rare)
    word_ids = np.repeat(np.arange(len(counts)), counts)
    X = np.empty((len(word_ids), dim), dtype=np.float32)
    common = rng.standard_normal(dim)
    common *= 8 / np.linalg.norm(common)
    start = 0
    for n in counts:
        if spectrum == "flat":
            X[start:start + n] = rng.standard_normal((n, dim))
        else:
            rank = min(30, dim)
            basis = np.linalg.qr(rng.standard_normal((dim, rank)))[0]
            spread = rng.standard_normal((n, rank)) * (3.0 * 0.8 ** np.arange(rank)) @ basis.T
            X[start:start + n] = common + rng.standard_normal(dim) + spread + 0.3 * rng.standard_normal((n, dim))
        start += n
    order = rng.permutation(len(word_ids))
    return X[order], word_ids[order]


def dense_before(rows: np.ndarray) -> dict[str, Any]:
    """The previous algorithm: eigh of the n x n Gram matrices of the rows and the centred rows
    (n <= d), or of the d x d second moment and scatter matrix (n > d)."""
    n, dim = rows.shape
    centred = rows - rows.mean(axis=0)
    top_index = [min(n, dim) - 1] * 2
    if n <= dim:
        values, vectors = eigh(rows @ rows.T, subset_by_index=top_index)
        direction = rows.T @ vectors[:, 0]
        centred_top = eigh(centred @ centred.T, eigvals_only=True, subset_by_index=top_index)[0]
    else:
        values, vectors = eigh(rows.T @ rows, subset_by_index=top_index)
        direction = vectors[:, 0]
        centred_top = eigh(centred.T @ centred, eigvals_only=True, subset_by_index=top_index)[0]
    direction /= np.linalg.norm(direction)
    if direction @ rows.sum(axis=0) < 0:
        direction = -direction
    total = float(np.sum(centred**2))
    along = float(np.sum((centred @ direction) ** 2))
    return {"top": values[0], "centred_top": centred_top, "direction": direction, "uncentred": values[0] / np.sum(rows**2),
            "centred": centred_top / total, "svd_ratio": along / total}


def errors(spectrum: OccurrenceSpectrum, reference: dict[str, Any]) -> tuple[float, float]:
    """(max relative error of the values, max error of the direction quantities)."""
    values: list[float] = [abs(spectrum.top_eigenvalue / reference["top"] - 1), abs(spectrum.mev("uncentred") / reference["uncentred"] - 1)]
    if reference["centred_top"] > 0:
        values += [abs(spectrum.centred_top_eigenvalue / reference["centred_top"] - 1),
                   abs(spectrum.mev("centred") / reference["centred"] - 1)]
    directions = [float(np.linalg.norm(spectrum.direction - reference["direction"]))]
    if reference["svd_ratio"] > 0:
        directions.append(abs(spectrum.mev("svd_ratio") / reference["svd_ratio"] - 1))
    return max(values), max(directions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", default="768,2048,4096")
    parser.add_argument("--spectrum", choices=["anisotropic", "flat"], default="anisotropic")
    parser.add_argument("--frequent", type=int, default=20)
    parser.add_argument("--frequent-n", type=int, default=3000)
    parser.add_argument("--rare", type=int, default=2000)
    parser.add_argument("--rare-n", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dense-words", type=int, default=2, help="frequent words timed and checked densely (0: none)")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"{args.frequent} x {args.frequent_n} + {args.rare} x {args.rare_n} occurrences, float32, {args.spectrum} spectrum, "
          f"one BLAS thread, best of {args.repeats}")
    print(f"{'d':>6} {'algorithm':<36} {'seconds':>9} {'x norm pass':>12} {'x linalg.norm':>14} {'max rel err value':>18} {'max err direction':>18}")
    with threadpool_limits(limits=1):
        for dim in (int(d) for d in args.dims.split(",")):
            X, word_ids = make_occurrences(dim, frequent=args.frequent, frequent_n=args.frequent_n, rare=args.rare,
                                           rare_n=args.rare_n, spectrum=args.spectrum)
            n_words = args.frequent + args.rare
            norm_times, linalg_times, mev_times = [], [], []
            spectra: dict[int, OccurrenceSpectrum] = {}
            for _ in range(args.repeats):
                start = time.perf_counter()
                np.sqrt(np.einsum("ij,ij->i", X, X))
                norm_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                np.linalg.norm(X, axis=1)
                linalg_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                spectra = MEVAccumulator(n_words).add(X, word_ids=word_ids).result()
                mev_times.append(time.perf_counter() - start)
            norm, linalg = min(norm_times), min(linalg_times)
            checked = list(range(min(args.dense_words, args.frequent))) + list(range(args.frequent, n_words))
            value_error, direction_error, dense_frequent, dense_rare = 0.0, 0.0, 0.0, 0.0
            for word in checked:
                rows = X[word_ids == word].astype(np.float64)
                start = time.perf_counter()
                reference = dense_before(rows)
                elapsed = time.perf_counter() - start
                if word < args.frequent:
                    dense_frequent += elapsed
                else:
                    dense_rare += elapsed
                value, direction = errors(spectra[word], reference)
                value_error, direction_error = max(value_error, value), max(direction_error, direction)
            print(f"{dim:>6} {'norm pass (float32 row norms)':<36} {norm:>9.3f} {1:>12.1f} {norm / linalg:>14.2f}")
            print(f"{dim:>6} {'np.linalg.norm(X, axis=1)':<36} {linalg:>9.3f} {linalg / norm:>12.1f} {1:>14.2f}")
            print(f"{dim:>6} {'matrix-free (all variants)':<36} {min(mev_times):>9.3f} {min(mev_times) / norm:>12.1f} "
                  f"{min(mev_times) / linalg:>14.1f} {value_error:>18.1e} {direction_error:>18.1e}")
            if args.dense_words:
                dense = dense_frequent * args.frequent / min(args.dense_words, args.frequent) + dense_rare
                label = f"dense eigh, before (est. from {min(args.dense_words, args.frequent)} words)"
                print(f"{dim:>6} {label:<36} {dense:>9.1f} {dense / norm:>12.0f} {dense / linalg:>14.0f} {'reference':>18} {'reference':>18}")
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
