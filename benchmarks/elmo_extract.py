"""ELMo extraction throughput: `lmgeom extract` of an ELMo model against the bare forward pass of the
same module over the same length-sorted batches (goal: ratio >= 0.9).

The bare pass is `model(char_ids).layers()` on the batches `embed_sentences` makes, with the character
ids built beforehand; extraction adds the character ids, the copy of every layer to numpy, the store
writes (in a background thread) and the tables. Each mode runs in a fresh process.

    python benchmarks/elmo_extract.py [--model elmo-brown] [--sentences 1000] [--threads 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent(
    """
    import json, sys, tempfile, time
    import torch
    from lmgeom.corpus import lee
    from lmgeom.elmo import ElmoBiLM, TrainConfig, batch_to_ids
    from lmgeom.encoders.elmo import ElmoEncoder
    from lmgeom.runs import extract

    mode, model_name, n_sentences, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    corpus = lee().head(n_sentences)
    if model_name == "random":  # the default training configuration, untrained: the same cost per word
        torch.manual_seed(0)
        encoder = ElmoEncoder(ElmoBiLM(TrainConfig().model_config(20_000)), model_id="random")
    else:
        from lmgeom.encoders import load_encoder
        encoder = load_encoder(model_name, device="cpu")
    model = encoder.model
    words = [[w.text for w in s.words] for s in corpus.sentences]
    n_words = sum(map(len, words))
    started = time.perf_counter()
    if mode == "bare":
        order = sorted(range(len(words)), key=lambda i: -len(words[i]))
        batches = [batch_to_ids([words[i] for i in order[s : s + encoder.batch_size]], model.config.max_characters_per_token)
                   for s in range(0, len(order), encoder.batch_size)]
        started = time.perf_counter()
        with torch.inference_mode():
            for ids in batches:
                model(ids).layers()
    else:
        with tempfile.TemporaryDirectory() as out:
            extract(encoder, corpus, out + "/store")
    print(json.dumps({"seconds": time.perf_counter() - started, "words": n_words, "sentences": len(words)}))
    """
)


def run(mode: str, model: str, sentences: int, threads: int) -> dict:
    output = subprocess.run([sys.executable, "-c", WORKER, mode, model, str(sentences), str(threads)],
                            check=True, capture_output=True, text=True)
    return json.loads(output.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="random", help="elmo-brown, an ELMo folder, or 'random' (default config, untrained)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode; the fastest counts")
    args = parser.parse_args()
    best = {mode: min((run(mode, args.model, args.sentences, args.threads) for _ in range(args.repeat)), key=lambda r: r["seconds"])
            for mode in ("bare", "extract")}
    print(f"ELMo ({args.model}), {best['bare']['sentences']:,} Lee sentences, {best['bare']['words']:,} words, "
          f"{args.threads} threads, best of {args.repeat}")
    print(f"{'mode':<10}{'seconds':>10}{'words/s':>12}")
    for mode, result in best.items():
        print(f"{mode:<10}{result['seconds']:>10.2f}{result['words'] / result['seconds']:>12,.0f}")
    print(f"extract / bare words/s: {best['bare']['seconds'] / best['extract']['seconds']:.2f} (goal >= 0.9)")


if __name__ == "__main__":
    main()
