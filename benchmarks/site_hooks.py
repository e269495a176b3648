"""What the capture sites cost: the forward pass with four sites' hooks against the forward pass with
hidden states a user writes by hand, storage aside; and how large each site is on disk.

Three sides alternate in one process (bare, hooks, encode x4, bare, ...), so each sees the same
machine load; the median of `--repeat` rounds is reported:

- **bare**: the user's loop: the corpus's sentences in batches of `--batch` (sorted by length),
  `model(**tokenizer(texts, padding=True), output_hidden_states=True)`, nothing kept;
- **bare + 4 hooks**: the same loop with forward hooks (pre-hooks for inputs) on the modules of
  `resid_pre`, `attn_out`, `mlp_out` and `resid_mid` of every block (`lmgeom.encoders.sites.Capture`),
  each tensor moved to the CPU as float32 (what lmgeom keeps of a site before pooling);
- **encode** and **encode, 4 sites**: `HFEncoder.encode` (pieces pooled into words), resid_post only and
  with the four other sites.

The goal is hooks / bare <= 1.2. The size column is a store's float32 bytes per site: words x layers x
dim x 4 (`resid_post` has layer 0 too; the other sites layers 1..L), for the corpus given and, scaled
by its word count, for all of Lee (67,080 words).

    python benchmarks/site_hooks.py --model minilm,smollm2 --sentences 200 --repeat 3 --threads 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch

from lmgeom.corpus import load_corpus
from lmgeom.encoders import load_encoder
from lmgeom.encoders.sites import Capture

SITES = ("resid_pre", "attn_out", "mlp_out", "resid_mid")
LEE_WORDS = 67_080


def _batches(encoder: Any, texts: list[str], batch: int) -> list[dict[str, torch.Tensor]]:
    order = sorted(range(len(texts)), key=lambda i: len(encoder.tokenizer(texts[i])["input_ids"]))
    out = []
    for start in range(0, len(order), batch):
        part = [texts[i] for i in order[start:start + batch]]
        out.append(dict(encoder.tokenizer(part, padding=True, truncation=True, max_length=encoder.max_length,
                                          return_tensors="pt")))
    return out


def _timed(run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def measure(model_name: str, sentences: int, repeat: int, batch: int) -> dict[str, Any]:
    encoder: Any = load_encoder(model_name, device="cpu")
    corpus = load_corpus("lee", limit=sentences)
    texts = [s.text for s in corpus.sentences]
    batches = _batches(encoder, texts, batch)
    model = encoder.model
    captures = encoder.site_captures(["resid_post", *SITES])

    def bare() -> None:
        with torch.inference_mode():
            for inputs in batches:
                model(**inputs, output_hidden_states=True)

    def hooked() -> None:
        with Capture(model, captures) as caught, torch.inference_mode():
            for inputs in batches:
                out = model(**inputs, output_hidden_states=True)
                shape = tuple(out.hidden_states[0].shape)
                for tensor in caught.pop(shape).values():
                    tensor.float().cpu()

    def encode() -> None:
        encoder.encode(corpus.sentences)

    def encode_sites() -> None:
        encoder.encode(corpus.sentences, sites=["resid_post", *SITES])

    sides = {"bare": bare, "bare + 4 hooks": hooked, "encode": encode, "encode, 4 sites": encode_sites}
    bare()  # warm-up
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeat):
        for name, run in sides.items():
            seconds[name].append(_timed(run))
    median = {name: statistics.median(values) for name, values in seconds.items()}
    words = sum(len(s.words) for s in corpus.sentences)
    per_site = {"resid_post": words * encoder.n_layers * encoder.dim * 4,
                **{site: words * (encoder.n_layers - 1) * encoder.dim * 4 for site in SITES}}
    return {"model": model_name, "sentences": len(texts), "words": words, "median": median,
            "hooks_ratio": median["bare + 4 hooks"] / median["bare"],
            "encode_ratio": median["encode, 4 sites"] / median["encode"],
            "bytes_per_site": per_site, "lee_bytes_per_site": {k: v * LEE_WORDS / words for k, v in per_site.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm,smollm2")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = [measure(name, args.sentences, args.repeat, args.batch) for name in args.model.split(",")]
    print(f"Lee, first {args.sentences} sentences, {args.threads} thread(s), median of {args.repeat} alternating rounds (s)")
    print("| model | bare forward | + 4 site hooks | hooks / bare | encode | encode, 4 sites | 4 sites / 1 | GB per site, all of Lee |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r["median"]
        print(f"| {r['model']} | {m['bare']:.2f} | {m['bare + 4 hooks']:.2f} | {r['hooks_ratio']:.2f} | {m['encode']:.2f} | "
              f"{m['encode, 4 sites']:.2f} | {r['encode_ratio']:.2f} | "
              f"{r['lee_bytes_per_site']['resid_post'] / 1e9:.2f} (resid_post), {r['lee_bytes_per_site']['attn_out'] / 1e9:.2f} (others) |")


if __name__ == "__main__":
    main()
