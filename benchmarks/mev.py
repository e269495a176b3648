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

MiniLM width (d = 384): --zipf WORDS draws a vocabulary like a real MiniLM layer over the Lee corpus
(word r has max(5, 3,530 r^-0.86) occurrences: 2 words above 1,536, about 13 above 384, half the
words at 5-10; 1,820 words give about 48,000 rows, a real Lee layer 50,329 of 1,820 words), rows as
above; --store PATH --layers L,... takes a real store's layers instead (the rows and words that
`lmgeom analyze` hands MEV). There every word is checked against dense eigh, and with
--compare-with FILE (a `lmgeom/metrics/spectrum.py` of another revision, e.g. from `git show`) the
result step of both is timed interleaved on the same accumulator (old, new, old, new, ...).

Run: python benchmarks/mev.py [--dims 768,2048,4096] [--spectrum anisotropic|flat] [--dense-words 2]
     python benchmarks/mev.py --dims 384 --zipf 1820 [--compare-with OLD_SPECTRUM_PY]
     python benchmarks/mev.py --store STORE --layers 1,6 [--compare-with OLD_SPECTRUM_PY]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import platform
import time
from typing import Any

import numpy as np
from scipy.linalg import eigh
from threadpoolctl import threadpool_limits

from lmgeom.metrics import MEVAccumulator, contextuality
from lmgeom.metrics import spectrum as current_spectrum
from lmgeom.metrics.spectrum import OccurrenceSpectrum


def zipf_counts(words: int) -> np.ndarray:
    """Occurrence counts of a MiniLM-over-Lee-like vocabulary, most frequent first."""
    return np.maximum(5, np.round(3530 * np.arange(1, words + 1) ** -0.86)).astype(np.int64)


def make_occurrences(dim: int, counts: np.ndarray, *, spectrum: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """float32 rows and word ids (word i has counts[i] rows), rows in a shuffled corpus order."""
    rng = np.random.default_rng(seed)
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


def store_layer(path: str, layer: int) -> tuple[np.ndarray, np.ndarray, int]:
    """The rows and word ids `lmgeom analyze` hands MEV at `layer` (default selection and words)."""
    from lmgeom import RepresentationStore
    from lmgeom.engine import plan_analysis

    store = RepresentationStore.open(path)
    word_index = plan_analysis(store)[1].words.word_index
    kept = word_index >= 0
    return np.ascontiguousarray(np.asarray(store.layer(layer)[:])[kept]), word_index[kept], int(word_index.max()) + 1


def load_spectrum_module(path: str) -> Any:
    """Another revision's `lmgeom/metrics/spectrum.py`, imported under its own name."""
    spec = importlib.util.spec_from_file_location("compared_spectrum", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def interleaved_results(accumulator: MEVAccumulator, compared: Any, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds of `result()` with the compared spectrum module and with the current one, alternating."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for module, elapsed in ((compared, times[0]), (current_spectrum, times[1])):
            # every variant, as `analyze` solves them (a spectrum.py older than `variants=` takes no such parameter)
            contextuality.rows_spectra = lambda words, variants=None, module=module: module.rows_spectra(words)
            contextuality.moment_spectrum = lambda n, s, m, variants=None, module=module: module.moment_spectrum(n, s, m)
            start = time.perf_counter()
            accumulator.result()
            elapsed.append(time.perf_counter() - start)
    contextuality.rows_spectra, contextuality.moment_spectrum = current_spectrum.rows_spectra, current_spectrum.moment_spectrum
    return times


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
    parser.add_argument("--zipf", type=int, default=0, help="this many words with MiniLM-over-Lee-like counts instead")
    parser.add_argument("--store", help="a store whose layers (--layers) give the rows instead")
    parser.add_argument("--layers", default="1,6")
    parser.add_argument("--compare-with", help="a spectrum.py of another revision: its result() timed interleaved with this one's")
    args = parser.parse_args()
    if args.store:
        cases = [f"store layer {layer}" for layer in args.layers.split(",")]
    else:
        cases = [f"d = {d}" for d in args.dims.split(",")]
    counts = zipf_counts(args.zipf) if args.zipf else np.array([args.frequent_n] * args.frequent + [args.rare_n] * args.rare)
    source = (f"store {args.store}" if args.store else
              f"{len(counts)} Zipf words, {counts.sum()} occurrences" if args.zipf else
              f"{args.frequent} x {args.frequent_n} + {args.rare} x {args.rare_n} occurrences")
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; "
          f"{source}, float32, {args.spectrum} spectrum, one BLAS thread, best of {args.repeats}")
    print(f"{'d':>6} {'algorithm':<36} {'seconds':>9} {'x norm pass':>12} {'x linalg.norm':>14} {'max rel err value':>18} {'max err direction':>18}")
    compared = load_spectrum_module(args.compare_with) if args.compare_with else None
    with threadpool_limits(limits=1):
        for case in cases:
            if args.store:
                X, word_ids, n_words = store_layer(args.store, int(case.split()[-1]))
                dim = X.shape[1]
            else:
                dim = int(case.split()[-1])
                X, word_ids = make_occurrences(dim, counts, spectrum=args.spectrum)
                n_words = len(counts)
            # the frequent words (densely timed on --dense-words of them) and the others, all checked
            frequent = args.frequent if not (args.zipf or args.store) else 0
            norm_times, linalg_times, mev_times, add_times = [], [], [], []
            spectra: dict[int, OccurrenceSpectrum] = {}
            for _ in range(args.repeats):
                start = time.perf_counter()
                np.sqrt(np.einsum("ij,ij->i", X, X))
                norm_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                np.linalg.norm(X, axis=1)
                linalg_times.append(time.perf_counter() - start)
                start = time.perf_counter()
                accumulator = MEVAccumulator(n_words).add(X, word_ids=word_ids)
                add_times.append(time.perf_counter() - start)
                spectra = accumulator.result()
                mev_times.append(time.perf_counter() - start)
            norm, linalg = min(norm_times), min(linalg_times)
            checked = list(range(min(args.dense_words, frequent))) + list(range(frequent, n_words))
            value_error, direction_error, dense_frequent, dense_rare = 0.0, 0.0, 0.0, 0.0
            for word in checked:
                rows = X[word_ids == word].astype(np.float64)
                start = time.perf_counter()
                reference = dense_before(rows)
                elapsed = time.perf_counter() - start
                if word < frequent:
                    dense_frequent += elapsed
                else:
                    dense_rare += elapsed
                value, direction = errors(spectra[word], reference)
                value_error, direction_error = max(value_error, value), max(direction_error, direction)
            print(f"{dim:>6} {'norm pass (float32 row norms)':<36} {norm:>9.3f} {1:>12.1f} {norm / linalg:>14.2f}")
            print(f"{dim:>6} {'np.linalg.norm(X, axis=1)':<36} {linalg:>9.3f} {linalg / norm:>12.1f} {1:>14.2f}")
            print(f"{dim:>6} {'matrix-free (all variants)':<36} {min(mev_times):>9.3f} {min(mev_times) / norm:>12.1f} "
                  f"{min(mev_times) / linalg:>14.1f} {value_error:>18.1e} {direction_error:>18.1e}")
            if compared is not None:  # the add step is the same code in both: its best time above
                before, after = interleaved_results(accumulator, compared, args.repeats)
                add = min(add_times)
                for label, times in ((f"matrix-free, {os.path.basename(args.compare_with)}", before), ("matrix-free, this revision", after)):
                    print(f"{dim:>6} {label:<36} {add + min(times):>9.3f} {(add + min(times)) / norm:>12.1f} "
                          f"{(add + min(times)) / linalg:>14.1f}   result() best {min(times):.3f} s, median {np.median(times):.3f} s")
                print(f"{dim:>6} {'result() compared / this revision':<36} {min(before) / min(after):>9.2f} (best) "
                      f"{np.median(before) / np.median(after):.2f} (median)")
            if args.dense_words or not frequent:
                dense = dense_frequent * frequent / max(1, min(args.dense_words, frequent)) + dense_rare
                label = f"dense eigh, before (est. from {min(args.dense_words, frequent)} words)" if frequent else "dense eigh, before (every word)"
                print(f"{dim:>6} {label:<36} {dense:>9.1f} {dense / norm:>12.0f} {dense / linalg:>14.0f} {'reference':>18} {'reference':>18}")
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
