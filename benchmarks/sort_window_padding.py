"""Padding of the forward batches against the sort window: one window over the whole corpus, the local
engine's default window, the sharded engine's default windows for 1 to 8 workers (`resolve_shards`:
a shard sorted whole, up to the memory budget's window), one chunk.

Each sentence's model inputs are tokenized exactly as `lmgeom extract` builds them (special tokens,
windows of long sentences), a window's inputs are cut into batches by extraction's rule (longest
first, at most 64 inputs and 8,192 padded ids a batch: `HFEncoder._batches`), and the padded ids
(inputs × the batch's longest) are summed. `padded / pieces` is the factor by which padding inflates
the forward pass's input; no forward pass runs.

    python benchmarks/sort_window_padding.py --model smollm2 --corpus lee
"""

from __future__ import annotations

import argparse

import numpy as np

from lmgeom.corpus import load_corpus
from lmgeom.encoders import load_encoder
from lmgeom.encoders.alignment import chunk_windows, tokenize_chunk
from lmgeom.encoders.hf import HFEncoder
from lmgeom.stages.distributed import resolve_shards
from lmgeom.stages.extraction_options import ExtractionOptions


def padded_ids(encoder: HFEncoder, lengths: np.ndarray) -> int:
    """Ids the forward pass runs on one window of inputs of `lengths`, padding included."""
    return sum(len(batch) * int(lengths[batch[0]]) for batch in encoder._batches(lengths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--corpus", default="lee")
    parser.add_argument("--sentences", type=int, default=None, help="the first N sentences (default: all)")
    args = parser.parse_args()
    encoder = load_encoder(args.model, device="cpu")
    assert isinstance(encoder, HFEncoder), "the padding of Hugging Face encoders only"
    corpus = load_corpus(args.corpus, limit=args.sentences)
    chunk = tokenize_chunk(encoder.tokenizer, corpus.sentences, prepend_bos=encoder.prepend_bos, first_index=0,
                           skip_unaligned=True)
    windows = chunk_windows(chunk, encoder.max_length)
    lengths, first = windows.lengths, windows.first  # sentence s's inputs are lengths[first[s]:first[s + 1]]
    options = ExtractionOptions().resolve(encoder.n_layers, encoder.dim, len(corpus))
    chunk_sentences, local_window = int(options.chunk_sentences or 0), int(options.sort_window or 0)
    pieces = int(lengths.sum())

    def cost(window: int) -> int:
        return sum(padded_ids(encoder, lengths[first[start] : first[min(start + window, len(corpus))]])
                   for start in range(0, len(corpus), window))

    rows = [("one window: the whole corpus", len(corpus)), (f"the local engine's default ({local_window})", local_window)]
    for workers in (1, 2, 4, 8):
        sharded = resolve_shards(ExtractionOptions(), encoder.n_layers, encoder.dim, len(corpus), num_workers=workers)
        rows.append((f"sharded, {workers} worker{'s' if workers > 1 else ''}: shards of {sharded.shard_sentences} "
                     f"({sharded.sort_window})", int(sharded.sort_window or 0)))
    rows.append((f"one chunk ({chunk_sentences})", chunk_sentences))
    print(f"{args.model} on {len(corpus):,} {args.corpus} sentences: {pieces:,} input ids; chunks of {chunk_sentences}")
    print(f"{'sort window (sentences)':48}{'padded ids':>12}{'padded / pieces':>17}")
    for name, window in rows:
        total = cost(window)
        print(f"{name:48}{total:>12,}{total / pieces:>17.3f}")


if __name__ == "__main__":
    main()
