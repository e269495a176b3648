"""Isotropy measures and calibrators: lmgeom against straightforward reference implementations.

Cases, on n x 768 synthetic anisotropic Gaussian points (default n = 100k, float64):
- IsoScore: lmgeom `isoscore` vs the PyPI IsoScore package (`IsoScore.IsoScore(points)`).
- I(W): lmgeom `log_partition_isotropy` vs Ding et al.'s recipe (np.linalg.eig, a Python loop over
  the 768 directions, plain exp sums; one sign per eigenvector, so lmgeom runs with both_signs=False).
- CIE: lmgeom `ClusterIsotropy` (k=27, 12 PCs) fit+transform vs Rajaee & Pilehvar's per-point loop.
- Whitening: lmgeom `Whitening` fit+transform (batch, and streamed with partial_fit over 10k-row
  chunks) vs Su et al.'s np.cov + np.linalg.svd.
- Flow: lmgeom `FlowCalibrator` default fit on 10k x 384 (the "well under a minute" claim).

Each run is a fresh process with every library already imported: time is wall time, memory is the
peak RSS growth over the RSS after the data was generated. A reference estimated (from a probe on --probe-rows rows) to take longer
than --max-seconds runs on the probe rows only and its full-size time is extrapolated linearly in
n (marked "extrapolated"). Agreement is max |difference| against lmgeom on the same rows (for
transforms: over the first 2,000 output rows, eigenvector signs aligned for PCA whitening).

Run: python benchmarks/isotropy.py [--n 100000] [--append-docs]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import platform
import resource
import time
from pathlib import Path
from queue import Empty

import numpy as np
from IsoScore import IsoScore
from sklearn.cluster import KMeans
from sklearn.decomposition import PCA

from lmgeom.calibrate import ClusterIsotropy, FlowCalibrator, Whitening
from lmgeom.metrics.isotropy import isoscore, log_partition_isotropy

DIM = 768
AGREEMENT_ROWS = 2000


def make_points(n: int, dim: int = DIM, *, seed: int = 0) -> np.ndarray:
    """Rotated Gaussian with spreads 0.05..1 and an offset; the first rows do not depend on n."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, dim))
    param_rng = np.random.default_rng(seed + 1)
    rotation, _ = np.linalg.qr(param_rng.standard_normal((dim, dim)))
    scales, offset = np.geomspace(0.05, 1.0, dim), param_rng.normal(scale=0.1, size=dim)
    for start in range(0, n, 8192):  # blockwise so generation never holds a second n x dim array
        X[start : start + 8192] = (X[start : start + 8192] * scales) @ rotation + offset
    return X


# ---------------------------------------------------------------------------------------------
# reference implementations


def reference_isoscore(X):
    return float(IsoScore.IsoScore(X))


def reference_log_isotropy(X):
    """Ding et al. (2022) get_isotropy, in log at the end only."""
    _, eig_vectors = np.linalg.eig(np.matmul(np.transpose(X), X))
    max_f, min_f = -math.inf, math.inf
    for i in range(eig_vectors.shape[1]):
        c = np.real(eig_vectors[:, i])
        c = c if c[np.argmax(np.abs(c))] > 0 else -c  # lmgeom's sign convention, so both use the same directions
        f = float(np.sum(np.exp(np.matmul(X, c))))
        max_f, min_f = max(max_f, f), min(min_f, f)
    return math.log(min_f / max_f)


def reference_cie(X, n_cluster=27, n_pc=12, seed=0):
    """Rajaee & Pilehvar's cluster_based, loops as in their code (means vectorised per cluster)."""
    kmeans = KMeans(n_clusters=n_cluster, random_state=seed, n_init="auto").fit(X)
    label = kmeans.labels_
    post_rep = np.zeros_like(X)
    for i in range(n_cluster):
        members = np.nonzero(label == i)[0]
        cluster_mean = X[members].mean(axis=0)
        component = PCA().fit(X[members] - cluster_mean).components_
        for index in members:
            centred = X[index] - cluster_mean
            sum_vec = np.zeros(X.shape[1])
            for j in range(min(n_pc, len(component))):  # the original assumes every cluster has >= n_pc points
                sum_vec = sum_vec + np.dot(centred, component[j]) * component[j]
            post_rep[index] = centred - sum_vec
    return post_rep


def reference_whitening(X):
    """Su et al. (2021) compute_kernel_bias + transform_and_normalize without the normalisation."""
    mu = X.mean(axis=0, keepdims=True)
    cov = np.cov(X.T)
    u, s, _ = np.linalg.svd(cov)
    W = np.dot(u, np.diag(1 / np.sqrt(s)))
    return (X - mu) @ W


# ---------------------------------------------------------------------------------------------
# lmgeom implementations


def lmgeom_isoscore(X):
    return isoscore(X)


def lmgeom_log_isotropy(X):
    return log_partition_isotropy(X, both_signs=False)


def lmgeom_cie(X):
    return ClusterIsotropy(random_state=0).fit(X).transform(X)


def lmgeom_whitening(X):
    return Whitening().fit(X).transform(X)


def lmgeom_whitening_streamed(X):
    whitening = Whitening()
    for start in range(0, len(X), 10_000):
        whitening.partial_fit(X[start : start + 10_000])
    return np.concatenate([whitening.transform(X[start : start + 10_000]) for start in range(0, len(X), 10_000)])


def lmgeom_flow(X):
    flow = FlowCalibrator().fit(X)
    return float(flow.loss_curve_[-1])


IMPLEMENTATIONS = {
    "reference_isoscore": reference_isoscore,
    "reference_log_isotropy": reference_log_isotropy,
    "reference_cie": reference_cie,
    "reference_whitening": reference_whitening,
    "lmgeom_isoscore": lmgeom_isoscore,
    "lmgeom_log_isotropy": lmgeom_log_isotropy,
    "lmgeom_cie": lmgeom_cie,
    "lmgeom_whitening": lmgeom_whitening,
    "lmgeom_whitening_streamed": lmgeom_whitening_streamed,
    "lmgeom_flow": lmgeom_flow,
}


def _child(name: str, n: int, dim: int, queue) -> None:
    X = make_points(n, dim)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    result = IMPLEMENTATIONS[name](X)
    seconds = time.perf_counter() - started
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    if isinstance(result, np.ndarray):
        result = np.asarray(result[:AGREEMENT_ROWS], dtype=np.float64)
    queue.put({"seconds": seconds, "peak_mb": peak_mb, "result": result})


def run(name: str, n: int, dim: int = DIM) -> dict:
    """One implementation on n points, in a fresh process."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_child, args=(name, n, dim, queue))
    process.start()
    while True:
        try:
            outcome = queue.get(timeout=5)
            break
        except Empty:
            if not process.is_alive():
                raise RuntimeError(f"{name} on {n} rows died (exit code {process.exitcode}); see its traceback above")
    process.join()
    return {"name": name, "rows": n, **outcome}


def agreement(a, b, *, align_signs: bool = False) -> float:
    if not isinstance(a, np.ndarray):
        return abs(a - b)
    if align_signs:
        b = b * np.sign((a * b).sum(axis=0))
    return float(np.abs(a - b).max())


# ---------------------------------------------------------------------------------------------


CASES = [
    # (label, lmgeom implementations, reference, align eigenvector signs)
    ("IsoScore", ["lmgeom_isoscore"], "reference_isoscore", False),
    ("log I(W), one sign", ["lmgeom_log_isotropy"], "reference_log_isotropy", False),
    ("CIE fit+transform", ["lmgeom_cie"], "reference_cie", False),
    ("Whitening fit+transform", ["lmgeom_whitening", "lmgeom_whitening_streamed"], "reference_whitening", True),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="points (default 100k)")
    parser.add_argument("--probe-rows", type=int, default=5_000, help="rows of the timing probe for references")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="references estimated slower run on the probe rows only")
    parser.add_argument("--skip-flow", action="store_true")
    parser.add_argument("--append-docs", action="store_true", help="append the table to docs/performance.md")
    args = parser.parse_args()

    rows = []
    for label, ours, reference, align in CASES:
        print(f"running {label} ...", flush=True)
        lmgeom_runs = [run(name, args.n) for name in ours]
        probe = run(reference, args.probe_rows)
        estimate = probe["seconds"] * args.n / args.probe_rows
        extrapolated = estimate > args.max_seconds
        ref = probe if extrapolated else run(reference, args.n)
        for result in lmgeom_runs:
            compared = run(result["name"], args.probe_rows) if extrapolated else result
            diff = agreement(compared["result"], ref["result"], align_signs=align)
            rows.append((label, result["name"], result["rows"], result["seconds"], result["seconds"], False, result["peak_mb"], diff))
        rows.append((label, reference, ref["rows"], ref["seconds"], estimate if extrapolated else ref["seconds"], extrapolated, ref["peak_mb"], float("nan")))
    if not args.skip_flow:
        flow = run("lmgeom_flow", 10_000, 384)
        rows.append(("Flow fit, defaults, 10k x 384", "lmgeom_flow", 10_000, flow["seconds"], flow["seconds"], False, flow["peak_mb"], float("nan")))

    header = f"| case | implementation | rows run | time (s) | time at n={args.n:,} (s) | peak extra RSS (MB) | max abs diff vs lmgeom |"
    lines = [header, "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for label, name, n_rows, seconds, full, extrapolated, peak, diff in rows:
        full_text = f"{full:,.1f}" + (" (extrapolated)" if extrapolated else "")
        if label.startswith("Flow"):
            full_text = "n/a"
        lines.append(f"| {label} | {name} | {n_rows:,} | {seconds:,.2f} | {full_text} | {peak:,.0f} | {'' if math.isnan(diff) else f'{diff:.2e}'} |")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    table = "\n".join(lines)
    print(table)
    print(machine)
    if args.append_docs:
        docs = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
        with open(docs, "a", encoding="utf-8") as handle:
            handle.write(
                f"\n## Isotropy measures and calibrators\n\n`python benchmarks/isotropy.py --n {args.n}`: "
                f"{args.n:,} x {DIM} float64 synthetic anisotropic Gaussian points; {machine}. Each run is a fresh "
                "process; memory is peak RSS growth after the data was generated. References whose probe on "
                f"{args.probe_rows:,} rows predicted more than {args.max_seconds:.0f} s ran on the probe rows only "
                "(full-size time extrapolated linearly in n), and their agreement is against lmgeom on those rows.\n\n"
                f"{table}\n"
            )


if __name__ == "__main__":
    main()
