"""Raw against zstd-compressed layers: store size, extraction (write) time and the time of a full
read of every layer (`RepresentationStore.iter_chunks`, the analysis's read), median of --repeat.

Each store is extracted afresh (`lmgeom.stages.extract_model`, its wall time includes the model's
forward passes, the same for both) into a folder under --work; each read opens the store anew and
pulls every layer through `iter_chunks` in order, summing the rows (so nothing is optimised away).
The page cache is not dropped: reads after the first come from memory, which is what a second
analysis of the same store sees, and what isolates decompression from disk speed.

Run: python benchmarks/compression.py [--model minilm] [--corpus lee] [--repeat 3] [--work /tmp/lmgeom-compression]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from lmgeom.stages import extract_model
from lmgeom.store import RepresentationStore


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def layer_bytes(path: Path) -> int:
    return folder_bytes(path / "layers")


def full_read(path: Path) -> float:
    started = time.perf_counter()
    store = RepresentationStore.open(path)
    total = 0.0
    for layer in store.layers:
        for _, rows in store.iter_chunks(layer):
            total += float(np.asarray(rows[:1], dtype=np.float64).sum())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--corpus", default="lee")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("/tmp/lmgeom-compression"))
    args = parser.parse_args()
    rows = []
    for compress in (None, "zstd"):
        out = args.work / (compress or "raw")
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        store = extract_model(args.model, args.corpus, out=out, device=args.device, compress=compress)
        write = time.perf_counter() - started
        reads = [full_read(out) for _ in range(args.repeat)]
        rows.append((compress or "raw", store.n_tokens, store.dim, len(store.layers), folder_bytes(out),
                     layer_bytes(out), write, statistics.median(reads)))
    print(f"{args.model} x {args.corpus}: median of {args.repeat} full reads")
    print("| layers | store | layer chunks | extract (write) | full read of every layer | read rate |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, n_rows, dim, n_layers, total, chunks, write, read in rows:
        rate = n_rows * dim * 4 * n_layers / read / 1e9
        print(f"| {name} | {total / 1e6:.1f} MB | {chunks / 1e6:.1f} MB | {write:.1f} s | {read:.2f} s | {rate:.2f} GB/s of float32 |")
    raw, packed = rows
    print(f"zstd: {packed[5] / raw[5]:.1%} of the raw chunk bytes, reads {packed[7] / raw[7]:.1f}x as long")


if __name__ == "__main__":
    main()
