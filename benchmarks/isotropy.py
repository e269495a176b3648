"""Isotropy measures and calibrators: lmgeom against straightforward reference implementations.

Cases, on n x 768 synthetic anisotropic Gaussian points (default n = 100k, float64):
- IsoScore: lmgeom `isoscore` vs the PyPI IsoScore package (`IsoScore.IsoScore(points)`).
- I(W): lmgeom `log_partition_isotropy` vs Ding et al.'s recipe (np.linalg.eig, a Python loop over
  the 768 directions, plain exp sums; one sign per eigenvector, so lmgeom runs with both_signs=False).
- CIE: lmgeom `ClusterIsotropy` (k=27, 12 PCs) fit+transform vs Rajaee & Pilehvar's per-point loop.
- Whitening: lmgeom `Whitening` fit+transform (batch, and streamed with partial_fit over 10k-row
  chunks) vs Su et al.'s np.cov + np.linalg.svd.
- Flow: lmgeom `FlowCalibrator` default fit on 10k x 384 (the "well under a minute" claim).
- Self-similarity of one word with --selfsim-n occurrences: lmgeom's closed form vs the original
  pairwise code (kawine/contextual; `benchmarks/contextuality.py`).

Peers and limits: each case also times the limit of what it computes, so the table gives ours
against the peer a user would otherwise pick and against the least work the measure needs:
IsoScore and whitening need a covariance, so one pass computing X^T X; CIE needs its k-means
(same k, seed and n_init); self-similarity needs one pass computing the row norms.

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
from lmgeom.metrics.contextuality import self_similarity
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


def reference_self_similarity(X):
    from contextuality import original_self_similarity

    embeddings = {str(i): X[i][None, None, :] for i in range(len(X))}
    return original_self_similarity([(i, 0) for i in range(len(X))], embeddings, 0)


def limit_xtx(X):
    """One pass computing X^T X: the least work of any covariance-based measure."""
    return X.T @ X


def limit_kmeans(X):
    """The k-means CIE needs (k = 27, as ClusterIsotropy's default and the reference)."""
    return KMeans(n_clusters=27, random_state=0, n_init="auto").fit(X).inertia_


def limit_norms(X):
    """One pass computing the row norms: the least work of a cosine statistic."""
    return np.sqrt(np.einsum("ij,ij->i", X, X))


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


def lmgeom_self_similarity(X):
    return float(self_similarity(X, np.zeros(len(X), dtype=np.int64)).iloc[0])


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
    "reference_self_similarity": reference_self_similarity,
    "lmgeom_self_similarity": lmgeom_self_similarity,
    "limit_xtx": limit_xtx,
    "limit_kmeans": limit_kmeans,
    "limit_norms": limit_norms,
}


def _child(name: str, n: int, dim: int, queue) -> None:
    X = make_points(n, dim)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    result = IMPLEMENTATIONS[name](X)
    seconds = time.perf_counter() - started
    peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    if name.startswith("limit_"):
        result = float("nan")  # a limit computes part of the measure: nothing to compare
    elif isinstance(result, np.ndarray):
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
    # (label, lmgeom implementations, reference, limit, align eigenvector signs, rows: None = --n)
    ("IsoScore", ["lmgeom_isoscore"], "reference_isoscore", "limit_xtx", False, None),
    ("log I(W), one sign", ["lmgeom_log_isotropy"], "reference_log_isotropy", "limit_xtx", False, None),
    ("CIE fit+transform", ["lmgeom_cie"], "reference_cie", "limit_kmeans", False, None),
    ("Whitening fit+transform", ["lmgeom_whitening", "lmgeom_whitening_streamed"], "reference_whitening", "limit_xtx", True, None),
    ("Self-similarity of one word", ["lmgeom_self_similarity"], "reference_self_similarity", "limit_norms", False, "selfsim"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=100_000, help="points (default 100k)")
    parser.add_argument("--probe-rows", type=int, default=5_000, help="rows of the timing probe for references")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="references estimated slower run on the probe rows only")
    parser.add_argument("--skip-flow", action="store_true")
    parser.add_argument("--selfsim-n", type=int, default=3000, help="occurrences of the word in the self-similarity case")
    parser.add_argument("--cases", default=None, help="comma-separated starts of case labels, any case: isoscore,log,cie,whitening,self (default: all)")
    parser.add_argument("--append-docs", action="store_true", help="append the table to docs/performance.md")
    args = parser.parse_args()

    rows = []
    # Labels hold commas ("log I(W), one sign"), so a request names the start of a label.
    wanted = None if args.cases is None else [w.strip().lower() for w in args.cases.split(",") if w.strip()]
    cases = [case for case in CASES if wanted is None or any(case[0].lower().startswith(w) for w in wanted)]
    for label, ours, reference, limit, align, size in cases:
        n = args.selfsim_n if size == "selfsim" else args.n
        print(f"running {label} ...", flush=True)
        # ours, the limit and the peer alternate, so load from other jobs falls on all of them alike
        lmgeom_runs = [run(name, n) for name in ours]
        limit_run = run(limit, n)
        probe = run(reference, min(args.probe_rows, n))
        estimate = probe["seconds"] * n / probe["rows"]
        extrapolated = estimate > args.max_seconds
        ref = probe if extrapolated else run(reference, n)
        peer_seconds = estimate if extrapolated else ref["seconds"]
        for result in lmgeom_runs:
            compared = run(result["name"], args.probe_rows) if extrapolated else result
            diff = agreement(compared["result"], ref["result"], align_signs=align)
            rows.append((label, result["name"], result["rows"], result["seconds"], result["seconds"], False, result["peak_mb"], diff,
                         result["seconds"] / peer_seconds, result["seconds"] / limit_run["seconds"]))
        rows.append((label, reference, ref["rows"], ref["seconds"], peer_seconds, extrapolated, ref["peak_mb"], float("nan"),
                     1.0, peer_seconds / limit_run["seconds"]))
        rows.append((label, limit, limit_run["rows"], limit_run["seconds"], limit_run["seconds"], False, limit_run["peak_mb"], float("nan"),
                     limit_run["seconds"] / peer_seconds, 1.0))
    if not args.skip_flow:
        flow = run("lmgeom_flow", 10_000, 384)
        rows.append(("Flow fit, defaults, 10k x 384", "lmgeom_flow", 10_000, flow["seconds"], flow["seconds"], False, flow["peak_mb"],
                     float("nan"), float("nan"), float("nan")))

    header = (f"| case | implementation | rows run | time (s) | time at the case's n (s) | x peer | x limit | peak extra RSS (MB) | "
              "max abs diff vs lmgeom |")
    lines = [header, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, name, n_rows, seconds, full, extrapolated, peak, diff, to_peer, to_limit in rows:
        full_text = f"{full:,.2f}" + (" (extrapolated)" if extrapolated else "")
        if label.startswith("Flow"):
            full_text = "n/a"
        ratios = " | ".join("" if math.isnan(r) else f"{r:.2f}" for r in (to_peer, to_limit))
        lines.append(f"| {label} | {name} | {n_rows:,} | {seconds:,.2f} | {full_text} | {ratios} | {peak:,.0f} | "
                     f"{'' if math.isnan(diff) else f'{diff:.2e}'} |")
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end"
    table = "\n".join(lines)
    print(table)
    print(machine)
    if args.append_docs:
        docs = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
        with open(docs, "a", encoding="utf-8") as handle:
            handle.write(
                f"\n## Peers\n\n`python benchmarks/isotropy.py --n {args.n}`: "
                f"{args.n:,} x {DIM} float64 synthetic anisotropic Gaussian points; {machine}. Each run is a fresh "
                "process; memory is peak RSS growth after the data was generated. References whose probe on "
                f"{args.probe_rows:,} rows predicted more than {args.max_seconds:.0f} s ran on the probe rows only "
                "(full-size time extrapolated linearly in n), and their agreement is against lmgeom on those rows.\n\n"
                f"{table}\n"
            )


if __name__ == "__main__":
    main()
