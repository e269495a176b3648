"""The ratios of benchmarks/scale.py with the analysis on a CUDA GPU (`--device cuda`); "no GPU" otherwise.

The closed-form statistics (baselines, mean norm, SelfSim, IntraSim) compute in float64 on the
GPU; the store is read on the CPU and each chunk is copied to the GPU once. MEV runs on the CPU
(its rows are taken from the chunk before the copy). Rows: one streaming read of the store, the
analysis without MEV on the GPU, and on the CPU for comparison, then `analyze_store` with MEV on
the GPU. Stores: MiniLM-size (STS, 7 layers x 384) and the Lee corpus at d = 4,096.

Run: python benchmarks/gpu.py [--sizes sts:384:1:7,lee:4096:1] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import _size, corpus_words, print_table, store_rows, write_synthetic_store  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="sts:384:1:7,lee:4096:1")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: torch sees no CUDA device, so there is nothing to measure here "
              "(the GPU code path is tested on the CPU: tests/test_array_api.py)")
        return
    print(f"GPU: {torch.cuda.get_device_name(0)}")
    rows: list[dict[str, Any]] = []
    base = Path(tempfile.mkdtemp(dir=args.dir, prefix="lmgeom-gpu-"))
    try:
        for spec in args.sizes.split(","):
            corpus, dim, repeat, n_layers = _size(spec)
            path = base / spec.replace(":", "-")
            started = time.perf_counter()
            store = write_synthetic_store(path, corpus_words(corpus) * repeat, dim=dim, n_layers=n_layers)
            print(f"{spec}: {store.n_tokens:,} rows written in {time.perf_counter() - started:.0f} s", flush=True)
            for device, kinds in (("cpu", ["read", "analysis-no-mev"]), ("cuda", ["read", "analysis-no-mev", "analysis"])):
                os.environ["LMGEOM_BENCH_DEVICE"] = device  # the measuring child processes inherit it
                for row in store_rows(path, kinds=kinds, repeat=args.repeat):
                    rows.append({"size": spec, "corpus": f"{corpus} ({device})", "repeat": repeat, "rows": store.n_tokens,
                                 "dim": dim, "layers": n_layers, "store_gb": store.n_tokens * dim * n_layers * 4 / 1e9, **row})
            shutil.rmtree(path)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print_table(rows)


if __name__ == "__main__":
    main()
