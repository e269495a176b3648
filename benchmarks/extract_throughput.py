"""Extraction throughput against the bare forward pass a user would write, and where extraction's time goes.

The baseline is what a user writes by hand: the corpus's sentences sorted by length (in pieces)
across the whole corpus, cut into batches by the same rule as `lmgeom extract` (at most 64 sentences
and 8,192 padded pieces a batch), and for each batch `model(**tokenizer(texts, padding=True))` with
every layer computed (`output_hidden_states=True`) and nothing kept; ELMo: its sentences sorted by
length, `model(batch_to_ids(words)).layers()`. `lmgeom extract` does everything: tokenization and
alignment, the forward pass, pooling pieces into words, writing the store in corpus order and
finalising its tables. The two alternate in one process (bare, extract, bare, extract, ...), so both
see the same machine load; the ratio is bare seconds / extract seconds (goal >= 0.9), of the best and
of the median runs. Several models (`--model smollm2,gemma3`) run one after the other and share one
table at the end.

Each side's CPU seconds (all threads of the process) are printed too: under load, wall seconds
also measure waiting for a core, CPU seconds still measure the work.

The profile then runs extraction's windows stage by stage, synchronously: encode (with the model's
forward timed by hooks), commit, finalize, in wall and CPU seconds. `--repeat 0` runs the profile only.

`--memory` adds peak RSS of `lmgeom extract` for a 1x and a 10x corpus (the same sentences ten
times over), each in a fresh process (goal: 10x <= 1.5 x 1x).

`--corpus` takes any corpus spec `lmgeom extract --corpus` takes (default `lee`, e.g. `brown`);
`--sentences N` keeps its first N sentences.

    nice -n 19 python benchmarks/extract_throughput.py --model smollm2,gemma3 --sentences 100 --threads 1 --repeat 3 --no-profile
    python benchmarks/extract_throughput.py --model elmo-brown --sentences 2680 --threads 2 --repeat 5
    python benchmarks/extract_throughput.py --model minilm --sentences 2680 --threads 2 --repeat 5 --memory
    python benchmarks/extract_throughput.py --model minilm --corpus brown --sentences 1000 --threads 1 --repeat 1 --no-profile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from lmgeom.corpus import Corpus, load_corpus
from lmgeom.corpus.corpus import Sentence
from lmgeom.elmo import batch_to_ids
from lmgeom.encoders import load_encoder
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.elmo import ElmoEncoder
from lmgeom.encoders.hf import HFEncoder
from lmgeom.stages import extract
from lmgeom.stages.extraction_options import ExtractionOptions
from lmgeom.store import StoreWriter


def windows_of(encoder: Encoder, corpus: Corpus) -> tuple[list[list[Sentence]], int]:
    """The windows `extract` encodes at once (sorted by length within each), and its chunk size."""
    options = ExtractionOptions().resolve(encoder.n_layers, encoder.dim, len(corpus))
    size = int(options.sort_window or 0)
    return [list(corpus.sentences[first : first + size]) for first in range(0, len(corpus), size)], int(options.chunk_sentences or 0)


def bare_forward(encoder: Encoder, corpus: Corpus) -> Callable[[], None]:
    """The bare forward pass a user writes: sentences sorted by length across the corpus, batched by
    extraction's rule, tokenized and run batch by batch."""
    if isinstance(encoder, ElmoEncoder):
        model = encoder.model
        words = [[w.text for w in s.words] for s in corpus.sentences]
        batches = [[words[i] for i in batch] for batch in model.sentence_batches([len(w) for w in words], batch_size=encoder.batch_size)]

        def run_elmo() -> None:
            with torch.inference_mode():
                for batch in batches:
                    model(batch_to_ids(batch, model.config.max_characters_per_token).to(encoder.device)).layers()

        return run_elmo
    assert isinstance(encoder, HFEncoder)
    hf = encoder
    texts = [s.text for s in corpus.sentences]
    lengths = np.array([len(ids) for ids in hf.tokenizer(texts, truncation=True, max_length=hf.max_length)["input_ids"]])
    batches = [[texts[i] for i in batch] for batch in hf._batches(lengths)]  # longest first, at most 64 and 8,192 pieces
    if hf.tokenizer.pad_token_id is None:
        hf.tokenizer.pad_token_id = hf.pad_id

    def run_hf() -> None:
        with torch.inference_mode():
            for batch in batches:
                inputs = hf.tokenizer(batch, padding=True, truncation=True, max_length=hf.max_length, return_tensors="pt")
                hf.model(**inputs.to(hf.device), output_hidden_states=True, use_cache=False)

    return run_hf


def full_extract(encoder: Encoder, corpus: Corpus) -> Callable[[], None]:
    def run() -> None:
        with tempfile.TemporaryDirectory() as out:
            extract(encoder, corpus, Path(out) / "store")
    return run


def timed(function: Callable[[], object]) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def profile(encoder: Encoder, windows: list[list[Sentence]], chunk: int) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds per stage, every stage in this thread: encode (a window at a time) split into
    the model's forward (timed by hooks) and the rest, the commits (a chunk at a time), and finalize.
    CPU seconds count every thread of the process (torch's included), so under load they show the work
    a stage costs where wall seconds also show waiting for a core."""
    model: Any = getattr(encoder, "model")  # both encoders hold a torch module
    forward = [0.0, 0.0]
    started = [0.0, 0.0]

    def now() -> list[float]:
        return [time.perf_counter(), time.process_time()]

    def add_forward(*_: Any) -> None:
        wall, cpu = now()
        forward[0] += wall - started[0]
        forward[1] += cpu - started[1]

    pre = model.register_forward_pre_hook(lambda *_: started.__setitem__(slice(None), now()))
    post = model.register_forward_hook(add_forward)
    stages = {"forward pass": [0.0, 0.0], "rest of encode": [0.0, 0.0], "commit": [0.0, 0.0], "finalize": [0.0, 0.0]}

    def run(stage: str, function: Callable[[], Any]) -> Any:
        before = now()
        result = function()
        after = now()
        stages[stage][0] += after[0] - before[0]
        stages[stage][1] += after[1] - before[1]
        return result

    try:
        with tempfile.TemporaryDirectory() as out:
            writer = StoreWriter(Path(out) / "store", settings={**encoder.settings(), "dtype": "float32"})
            first = 0
            for sentences in windows:
                forward[:] = [0.0, 0.0]
                encoded = run("rest of encode", lambda: encoder.encode(sentences, first_index=first))
                for column in (0, 1):
                    stages["forward pass"][column] += forward[column]
                    stages["rest of encode"][column] -= forward[column]
                for start in range(0, len(sentences), chunk):
                    run("commit", lambda: writer.commit(encoded[start : start + chunk], [s.text for s in sentences[start : start + chunk]]))
                first += len(sentences)
            run("finalize", writer.finalize)
    finally:
        pre.remove()
        post.remove()
    return {stage: (wall, cpu) for stage, (wall, cpu) in stages.items()}


def elmo_layers_stack_seconds(encoder: ElmoEncoder, chunks: list[list[Sentence]]) -> float:
    """Seconds the bare ELMo baseline spends in `BiLMOutput.layers()` (stacking the layers into one new
    tensor), which `lmgeom extract` does not do: it copies each word's rows from the biLM's outputs."""
    model = encoder.model
    seconds = 0.0
    with torch.inference_mode():
        for sentences in chunks:
            words = [[w.text for w in s.words] for s in sentences]
            for batch in model.sentence_batches([len(w) for w in words], batch_size=encoder.batch_size):
                output = model(batch_to_ids([words[i] for i in batch], model.config.max_characters_per_token).to(encoder.device))
                seconds += timed(output.layers)
    return seconds


MEMORY_WORKER = textwrap.dedent(
    """
    import json, resource, sys, tempfile
    import torch
    from lmgeom.corpus import Corpus, load_corpus
    from lmgeom.encoders import load_encoder
    from lmgeom.stages import extract

    model, spec, n_sentences, copies, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(threads)
    corpus = Corpus("bench", list(load_corpus(spec, limit=n_sentences).sentences) * copies)
    with tempfile.TemporaryDirectory() as out:
        extract(load_encoder(model, device="cpu"), corpus, out + "/store")
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    """
)


def peak_rss_mb(model: str, corpus: str, sentences: int, copies: int, threads: int) -> float:
    output = subprocess.run([sys.executable, "-c", MEMORY_WORKER, model, corpus, str(sentences), str(copies), str(threads)],
                            check=True, capture_output=True, text=True).stdout
    return float(json.loads(output.strip().splitlines()[-1])["peak_rss_mb"])


def alternate(name: str, encoder: Encoder, corpus: Corpus, repeat: int, n_words: int) -> dict[str, Any]:
    """Bare forward and `lmgeom extract`, alternating `repeat` times after one warm-up each: wall
    seconds and their ratio, and the CPU seconds of the process (all threads), which under load
    still say how much work each side does."""
    modes = {"bare forward": bare_forward(encoder, corpus), "lmgeom extract": full_extract(encoder, corpus)}
    for run in modes.values():  # warm-up: allocator, lazy imports, page cache
        run()
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    loads = []
    for _ in range(repeat):
        for mode, run in modes.items():
            started = time.process_time()
            seconds[mode].append(timed(run))
            cpu[mode].append(time.process_time() - started)
        loads.append(os.getloadavg()[0])
    bare, full = seconds["bare forward"], seconds["lmgeom extract"]
    return {"model": name, "sentences": len(corpus), "words": n_words, "pairs": repeat,
            "bare best": min(bare), "bare median": statistics.median(bare), "extract best": min(full),
            "extract median": statistics.median(full), "ratio best": min(bare) / min(full),
            "ratio median": statistics.median(bare) / statistics.median(full),
            "cpu ratio": statistics.median(cpu["bare forward"]) / statistics.median(cpu["lmgeom extract"]),
            "load": f"{min(loads):.1f}-{max(loads):.1f}"}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'model':12}{'sentences':>10}{'words':>8}{'bare s':>9}{'extract s':>11}{'words/s':>9}"
          f"{'ratio best':>12}{'ratio median':>14}{'CPU ratio':>11}{'load':>10}")
    for row in rows:
        print(f"{row['model']:12}{row['sentences']:>10,}{row['words']:>8,}{row['bare best']:>9.2f}{row['extract best']:>11.2f}"
              f"{row['words'] / row['extract best']:>9,.0f}{row['ratio best']:>12.2f}{row['ratio median']:>14.2f}"
              f"{row['cpu ratio']:>11.2f}{row['load']:>10}")
    print("(seconds: the best of the alternating pairs; ratio = bare forward seconds / extract seconds, goal >= 0.9)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="comma-separated: minilm, smollm2, gemma3, elmo-brown, or any model load_encoder takes")
    parser.add_argument("--corpus", default="lee", help="a corpus spec, as `lmgeom extract --corpus` takes (lee, brown, ...)")
    parser.add_argument("--sentences", type=int, default=500, help="the first N sentences of the corpus")
    parser.add_argument("--repeat", type=int, default=3, help="bare/extract pairs, alternating (0: the profile only)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-profile", action="store_true", help="skip the stage-by-stage profile")
    parser.add_argument("--memory", action="store_true", help="also peak RSS for a 1x and a 10x corpus")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    corpus = load_corpus(args.corpus, limit=args.sentences)
    n_words = sum(len(s.words) for s in corpus.sentences)
    rows = []
    for name in args.model.split(","):
        encoder = load_encoder(name, device="cpu")
        windows, chunk = windows_of(encoder, corpus)
        print(f"{name}: {len(corpus):,} {args.corpus} sentences ({n_words:,} words) in {len(windows)} sort windows, "
              f"chunks of {chunk}, {args.threads} threads", flush=True)
        if args.repeat:
            rows.append(alternate(name, encoder, corpus, args.repeat, n_words))
            print_table(rows[-1:])
        if not args.no_profile:
            stages = profile(encoder, windows, chunk)
            total = sum(wall for wall, _ in stages.values())
            print(f"\nprofile, stage by stage in one thread of control ({total:.2f} s, load {os.getloadavg()[0]:.1f}):")
            print(f"{'stage':18}{'wall s':>9}{'share':>8}{'CPU s':>9}")
            for stage, (wall, cpu) in stages.items():
                print(f"{stage:18}{wall:>9.2f}{wall / total:>8.1%}{cpu:>9.2f}")
            if isinstance(encoder, ElmoEncoder):
                print(f"of the bare forward: layers() stack {elmo_layers_stack_seconds(encoder, windows):.2f} s "
                      "(the baseline builds it; extract copies rows from the biLM outputs instead)")
        if args.memory:
            small, big = (peak_rss_mb(name, args.corpus, len(corpus), copies, args.threads) for copies in (1, 10))
            print(f"\npeak RSS of extract: 1x {small:,.0f} MB, 10x {big:,.0f} MB, ratio {big / small:.2f} (goal <= 1.5)")
        del encoder
    if len(rows) > 1:
        print_table(rows)


if __name__ == "__main__":
    main()
