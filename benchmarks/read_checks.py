"""The CPU cost of checking every chunk file's and table's CRC32C as a store is read.

A MiniLM-sized synthetic store (`scale.write_synthetic_store`: the Lee corpus's 67,080 words, rows of
--dim float32 = offset + the word's centre + noise, --layers layers, raw chunks of about 4 MiB) is
written once under --work. Then, in CPU seconds of this process (`time.process_time`, so a busy
machine's other work does not count), median of --repeat (checked and unchecked alternating):
- every layer read in full along the analysis's path (`lmgeom.engine.loop.stored_chunks`), once with
  each chunk's CRC32C checked as Zarr reads it and once on the same store taken as one written
  without checksums (`RepresentationStore(path, meta)` with meta.json's `integrity` left out);
- the token table read both ways (`tokens`, checked against meta.json's CRC32C, or not);
- CRC32C alone over the layers' bytes, for scale; the open (`RepresentationStore.open`, every check);
- the analysis of the checked store, once, which the checks' extra CPU is set against: its streaming
  statistics alone (baselines, norms, self-similarity, intra-sentence similarity: `scale.py`'s
  `analysis-no-mev`) and the whole analysis (`analyze_store`, MEV included, one process). The bytes
  each checks are counted, so the extra is the per-read extra times the reads it makes.
Files come from the page cache after the first pass, as in a second analysis of one store.

Run: python benchmarks/read_checks.py [--dim 384] [--layers 2] [--repeat 15] [--work /tmp/lmgeom-read-checks]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import google_crc32c
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import _analysis, _analysis_without_mev, _read, corpus_words, write_synthetic_store  # noqa: E402

from lmgeom.store import RepresentationStore  # noqa: E402


def count_checked_bytes() -> list[int]:
    """From now on, the bytes every CRC32C check of `lmgeom.store.integrity` takes, summed (in a one-item list)."""
    from lmgeom.store import integrity

    total, digest = [0], integrity.crc32c

    def counted(data: Any) -> str:
        total[0] += len(data)
        return digest(data)

    integrity.crc32c = counted
    return total


def alternating(first: Callable[[], Any], second: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """The medians of `first` and `second` timed alternately (first, second, first, ...) `repeat` times each."""
    pairs = [(cpu(first, 1), cpu(second, 1)) for _ in range(repeat)]
    return statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs)


def cpu(work: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        work()
        times.append(time.process_time() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--no-analysis", action="store_true", help="time the reads only")
    parser.add_argument("--work", type=Path, default=Path("/tmp/lmgeom-read-checks"))
    args = parser.parse_args()
    path = args.work / "store"
    write_synthetic_store(path, corpus_words("lee"), dim=args.dim, n_layers=args.layers)
    meta = RepresentationStore.open(path).meta
    bare = {key: value for key, value in meta.items() if key != "integrity"}  # as a store without checksums
    checked, unchecked = (lambda: RepresentationStore(path, meta)), (lambda: RepresentationStore(path, bare))
    _read(checked())  # into the page cache
    layer_bytes = int(meta["n_tokens"]) * args.dim * 4 * args.layers
    data = [np.asarray(checked().layer(layer)[:]).reshape(-1).view(np.uint8) for layer in meta["stored_layers"]]
    crc = cpu(lambda: [google_crc32c.value(block) for block in data], args.repeat)
    opened = cpu(lambda: RepresentationStore.open(path), args.repeat)
    read_on, read_off = alternating(lambda: _read(checked()), lambda: _read(unchecked()), args.repeat)
    tokens_on, tokens_off = alternating(lambda: checked().tokens, lambda: unchecked().tokens, args.repeat)
    counted = count_checked_bytes()
    analyses = []
    for name, analysis in () if args.no_analysis else (
            ("streaming statistics (no MEV)", lambda: _analysis_without_mev(checked())),
            ("whole analysis (analyze_store, one process)", lambda: _analysis(checked(), num_workers=1))):
        counted[0] = 0
        seconds = cpu(analysis, 1)
        analyses.append((name, seconds, counted[0] / layer_bytes))  # the layers' bytes it checked, in full reads
    print(f"{args.layers} layers x {int(meta['n_tokens']):,} rows x {args.dim} float32 ({layer_bytes / 1e6:.0f} MB, raw): "
          f"CPU seconds, median of {args.repeat}")
    print("| step | unchecked | checked | checks' extra CPU |")
    print("|---|---:|---:|---:|")
    print(f"| read every layer (stored_chunks) | {read_off:.3f} s | {read_on:.3f} s | {read_on - read_off:+.3f} s |")
    print(f"| token table (tokens) | {tokens_off:.3f} s | {tokens_on:.3f} s | {tokens_on - tokens_off:+.3f} s |")
    print(f"| CRC32C alone of the layers' bytes | | {crc:.3f} s | {layer_bytes / crc / 1e9:.1f} GB/s |")
    print(f"| open (RepresentationStore.open, every check) | | {opened:.3f} s | |")
    if not analyses:
        return
    print()
    print("| analysis (checked) | CPU s | reads of the layers | checks' extra CPU | share |")
    print("|---|---:|---:|---:|---:|")
    for name, seconds, passes in analyses:
        extra = passes * (read_on - read_off) + (tokens_on - tokens_off)
        print(f"| {name} | {seconds:.2f} s | {passes:.1f} | {extra:+.3f} s | {extra / seconds:.2%} |")


if __name__ == "__main__":
    main()
