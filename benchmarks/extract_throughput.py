"""Extraction throughput and memory.

1. Pieces/s of `lmgeom extract` (tokenize, align, forward, pool, write the store) against a bare
   batched forward pass of the same model over the same sentences with the same length-sorted
   batches (goal: ratio >= 0.9).
2. Peak RSS of `lmgeom extract` for a 1x and a 10x corpus (goal: 10x <= 1.5 x 1x), each measured
   in a fresh process.

    python benchmarks/extract_throughput.py [--model minilm] [--sentences 500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent(
    """
    import json, resource, sys, tempfile, time
    import torch
    from lmgeom.corpus import Corpus, lee
    from lmgeom.encoders import load_encoder
    from lmgeom.runs import extract

    mode, model, n_sentences, copies = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(int(sys.argv[5]))
    base = lee().head(n_sentences).sentences
    corpus = Corpus("lee-bench", list(base) * copies)
    encoder = load_encoder(model, device="cpu")
    windows = [encoder.tokenizer(s.text)["input_ids"] for s in corpus.sentences]
    n_pieces = sum(len(w) for w in windows)
    started = time.perf_counter()
    if mode == "bare":
        order = sorted(range(len(windows)), key=lambda w: -len(windows[w]))
        with torch.inference_mode():
            for batch in encoder._batches(order, windows):
                length = len(windows[batch[0]])
                ids = torch.full((len(batch), length), encoder.pad_id)
                mask = torch.zeros((len(batch), length), dtype=torch.long)
                for row, w in enumerate(batch):
                    ids[row, : len(windows[w])] = torch.tensor(windows[w])
                    mask[row, : len(windows[w])] = 1
                encoder.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    else:
        with tempfile.TemporaryDirectory() as out:
            extract(encoder, corpus, out + "/store")
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "pieces": n_pieces, "sentences": len(corpus),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    """
)


def run(mode: str, model: str, sentences: int, copies: int, threads: int) -> dict:
    output = subprocess.run(
        [sys.executable, "-c", WORKER, mode, model, str(sentences), str(copies), str(threads)],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--sentences", type=int, default=500, help="sentences of the Lee corpus in the 1x corpus")
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions (the best is kept)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    bare = min((run("bare", args.model, args.sentences, 1, args.threads) for _ in range(args.repeat)), key=lambda r: r["seconds"])
    full = min((run("extract", args.model, args.sentences, 1, args.threads) for _ in range(args.repeat)), key=lambda r: r["seconds"])
    bare_big = run("bare", args.model, args.sentences, 10, args.threads)
    big = run("extract", args.model, args.sentences, 10, args.threads)

    print(f"model {args.model}, {args.sentences} Lee sentences ({full['pieces']:,} pieces), {args.threads} threads, "
          f"1x best of {args.repeat}, 10x once")
    print(f"{'':34}{'seconds':>10}{'pieces/s':>12}{'peak RSS MB':>14}")
    rows = (("bare batched forward (1x)", bare), ("lmgeom extract (1x)", full),
            ("bare batched forward (10x)", bare_big), ("lmgeom extract (10x)", big))
    for name, r in rows:
        print(f"{name:34}{r['seconds']:>10.2f}{r['pieces'] / r['seconds']:>12,.0f}{r['peak_rss_mb']:>14,.0f}")
    for label, a, b in (("1x", full, bare), ("10x", big, bare_big)):
        print(f"throughput ratio extract / bare forward, {label}: {b['seconds'] / a['seconds']:.2f} (goal >= 0.9)")
    print(f"peak RSS of extract, 10x / 1x corpus: {big['peak_rss_mb'] / full['peak_rss_mb']:.2f} (goal <= 1.5)")

if __name__ == "__main__":
    main()
