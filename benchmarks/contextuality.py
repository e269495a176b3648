"""Self-similarity: lmgeom's closed form against the original pairwise code (Ethayarajh 2019).

The original (kawine/contextual, analyze.py) lists every ordered pair of a word's occurrences,
samples 1,000 of them, and calls scipy.spatial.distance.cosine once per pair. lmgeom sums unit
vectors: (||sum u||^2 - n) / (n (n - 1)), exact. Both read one layer of synthetic vectors held in
memory (the original read them from HDF5, which only adds to its time).

For 10k occurrences the original's pair list (10^8 tuples, ~6 GB) does not fit this machine, so
its time and memory there are extrapolated from the largest measured size (both are O(n^2) in the
pair list; the 1,000 cosines are a constant).

A second table times the whole `analyze_store` (baselines, SelfSim, IntraSim, three MEV variants)
on a synthetic store with a Zipf vocabulary. Run: python benchmarks/contextuality.py
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
from scipy.spatial.distance import cosine

from lmgeom.metrics import self_similarity
from lmgeom.stages import analyze_store
from lmgeom.store import write_store_from_arrays


def original_self_similarity(occurrences, embeddings, layer, num_samples=1000):
    """analyze.py's calculate_word_similarity_across_sentences for one word and one layer (unrounded)."""
    indices = range(len(occurrences))
    index_pairs = [(i, j) for i, j in itertools.product(indices, indices) if i != j]
    if len(index_pairs) > num_samples:
        index_pairs = random.sample(index_pairs, num_samples)
    layer_similarities = []
    for i, j in index_pairs:
        sent_index_i, word_in_sent_index_i = occurrences[i]
        embedding_i = embeddings[str(sent_index_i)][layer, word_in_sent_index_i]
        sent_index_j, word_in_sent_index_j = occurrences[j]
        embedding_j = embeddings[str(sent_index_j)][layer, word_in_sent_index_j]
        layer_similarities.append(1 - cosine(embedding_i, embedding_j))
    return float(np.nanmean(layer_similarities))


def exact_pairwise_mean(X: np.ndarray, block: int = 1000) -> float:
    """Brute force: every entry of the n x n cosine matrix, minus the diagonal, blockwise."""
    U = X / np.linalg.norm(X, axis=1, keepdims=True)
    total = sum(float((U[start : start + block] @ U.T).sum()) for start in range(0, len(U), block))
    n = len(U)
    return (total - n) / (n * (n - 1))


def measure(function, *, repeats: int) -> tuple[float, float, object]:
    """Best wall time over `repeats`, and peak traced memory (MiB) of one more traced call."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        value = function()
        times.append(time.perf_counter() - started)
    tracemalloc.start()
    function()
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return min(times), peak, value


def zipf_store(path: Path, *, n_tokens: int, vocabulary: int, dim: int, n_layers: int, rng) -> object:
    """Sentences of 5-19 words drawn from a Zipf vocabulary; per-occurrence noise grows with depth."""
    probabilities = 1 / np.arange(1, vocabulary + 1)
    word_ids = rng.choice(vocabulary, size=n_tokens, p=probabilities / probabilities.sum())
    lengths = rng.integers(5, 20, size=n_tokens // 5)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), n_tokens)]
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    sentences = [[f"w{w}" for w in word_ids[a:b]] for a, b in zip(bounds[:-1], bounds[1:])]
    word_ids = word_ids[: bounds[-1]]
    centres = rng.normal(size=(vocabulary, dim)).astype(np.float32)
    hidden = [centres[word_ids] + 0.5 * layer * rng.normal(size=(len(word_ids), dim)).astype(np.float32) + layer
              for layer in range(n_layers)]
    return write_store_from_arrays(path, hidden, sentences)


def time_analyze_store(args, rng) -> None:
    with tempfile.TemporaryDirectory() as directory:
        store = zipf_store(Path(directory) / "store", n_tokens=args.store_tokens, vocabulary=5000, dim=args.store_dim,
                           n_layers=args.store_layers, rng=rng)
        elapsed, peak, result = measure(lambda: analyze_store(store), repeats=1)
    print(f"\nanalyze_store on a synthetic store ({store.n_tokens:,} tokens, d={store.dim}, {len(store.layers)} layers, "
          f"{result.counts['words_analysed']:,} words in >= 5 sentences)\n")
    print("| tokens | d | layers | words analysed | total time | per layer | peak traced memory |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {store.n_tokens:,} | {store.dim} | {len(store.layers)} | {result.counts['words_analysed']:,} | "
          f"{elapsed:.1f} s | {elapsed / len(store.layers):.1f} s | {peak:,.0f} MiB |")
    print("\n(time untraced; memory from a second, traced run)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 3000, 10000])
    parser.add_argument("--max-original", type=int, default=3000, help="largest size to run the original on")
    parser.add_argument("--store-tokens", type=int, default=100_000, help="tokens of the synthetic store (0: skip)")
    parser.add_argument("--store-dim", type=int, default=384)
    parser.add_argument("--store-layers", type=int, default=4)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    random.seed(0)
    offset = rng.normal(size=args.dim)  # a shared direction, as in anisotropic layers

    rows, measured = [], {}
    for n in args.sizes:
        vectors = (offset + 1.5 * rng.normal(size=(n, args.dim))).astype(np.float32)
        # the original's layout: one HDF5 dataset per sentence, (layers, words, dim); one occurrence each
        embeddings = {str(i): vectors[i][None, None, :] for i in range(n)}
        occurrences = [(i, 0) for i in range(n)]
        word_ids = np.zeros(n, dtype=np.int64)
        exact = exact_pairwise_mean(vectors.astype(np.float64))
        ours_time, ours_memory, ours = measure(lambda: self_similarity(vectors, word_ids)[0], repeats=5)
        if n <= args.max_original:
            original_time, original_memory, original = measure(
                lambda: original_self_similarity(occurrences, embeddings, 0), repeats=2 if n > 1000 else 3)
            measured[n] = (original_time, original_memory)
            note = "measured"
            original_error = f"{abs(original - exact):.1e}"
        else:
            largest = max(measured)
            scale = (n * (n - 1)) / (largest * (largest - 1))
            original_time, original_memory = measured[largest][0] * scale, measured[largest][1] * scale
            note = f"extrapolated from {largest} (x{scale:.0f})"
            original_error = "n/a"
        rows.append((n, ours_time, ours_memory, original_time, original_memory, original_time / ours_time,
                     abs(ours - exact), original_error, note))

    print(f"Self-similarity of one word, one layer, d={args.dim} (float32 vectors; exact = brute-force n x n cosine matrix)\n")
    print("| occurrences | lmgeom time | lmgeom peak | original time | original peak | speed-up | lmgeom − exact | original − exact | original |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n, t_ours, m_ours, t_orig, m_orig, speedup, err_ours, err_orig, note in rows:
        print(f"| {n:,} | {t_ours * 1e3:.2f} ms | {m_ours:.1f} MiB | {t_orig * 1e3:,.0f} ms | {m_orig:,.0f} MiB | "
              f"{speedup:,.0f}x | {err_ours:.1e} | {err_orig} | {note} |")
    if args.store_tokens:
        time_analyze_store(args, rng)


if __name__ == "__main__":
    main()
