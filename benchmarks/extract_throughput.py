"""Extraction throughput against the bare forward pass, and where extraction's time goes.

The baseline is the bare batched forward pass of the same model on exactly the batches `lmgeom
extract` runs: the corpus cut into the same committed chunks, each chunk's windows (or, for ELMo,
sentences) length-sorted and dynamically padded into the same batches, every layer computed
(`output_hidden_states=True`; ELMo: `model(char_ids).layers()`) and nothing kept. Its inputs
(token ids, character ids) are built before the clock starts. `lmgeom extract` does everything:
tokenization and alignment (ELMo: character ids), the forward pass, pooling pieces into words,
writing the store and finalising its tables. The two alternate in one process (bare, extract,
bare, extract, ...), so both see the same machine load; the ratio is bare seconds / extract seconds
(goal >= 0.9), of the best and of the median runs.

Each side's CPU seconds (all threads of the process) are printed too: under load, wall seconds
also measure waiting for a core, CPU seconds still measure the work.

The profile then runs the same chunks stage by stage, synchronously: encode (with the model's
forward timed by hooks), commit, finalize, in wall and CPU seconds; for ELMo also the seconds the
baseline spends stacking the layers (`layers()`), which extraction does not do. `--repeat 0` runs
the profile only.

`--memory` adds peak RSS of `lmgeom extract` for a 1x and a 10x corpus, each in a fresh process
(goal: 10x <= 1.5 x 1x).

    python benchmarks/extract_throughput.py --model elmo-brown --sentences 2680 --threads 2 --repeat 5
    python benchmarks/extract_throughput.py --model smollm2 --sentences 300 --threads 2 --repeat 5
    python benchmarks/extract_throughput.py --model minilm --sentences 2680 --threads 2 --repeat 5 --memory
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

from lmgeom.corpus import Corpus, lee
from lmgeom.corpus.corpus import Sentence
from lmgeom.elmo import batch_to_ids
from lmgeom.encoders import load_encoder
from lmgeom.encoders.alignment import chunk_windows, tokenize_chunk
from lmgeom.encoders.base import Encoder
from lmgeom.encoders.elmo import ElmoEncoder
from lmgeom.encoders.hf import HFEncoder
from lmgeom.runs import extract
from lmgeom.runs.extraction import default_chunk_sentences
from lmgeom.store import StoreWriter


def chunks_of(encoder: Encoder, corpus: Corpus) -> list[list[Sentence]]:
    """The chunks `extract` commits (and sorts within)."""
    size = default_chunk_sentences(encoder.n_layers, encoder.dim, len(corpus))
    return [list(corpus.sentences[first : first + size]) for first in range(0, len(corpus), size)]


def bare_forward(encoder: Encoder, chunks: list[list[Sentence]]) -> Callable[[], None]:
    """The bare forward pass over extraction's batches, inputs prepared beforehand."""
    if isinstance(encoder, ElmoEncoder):
        model = encoder.model
        batches = []
        for sentences in chunks:
            words = [[w.text for w in s.words] for s in sentences]
            for batch in model.sentence_batches([len(w) for w in words], batch_size=encoder.batch_size):
                batches.append(batch_to_ids([words[i] for i in batch], model.config.max_characters_per_token).to(encoder.device))

        def run_elmo() -> None:
            with torch.inference_mode():
                for ids in batches:
                    model(ids).layers()

        return run_elmo
    assert isinstance(encoder, HFEncoder)
    hf = encoder
    inputs: list[list[np.ndarray]] = []
    for sentences in chunks:
        windows = chunk_windows(tokenize_chunk(hf.tokenizer, sentences, prepend_bos=hf.prepend_bos, first_index=0), hf.max_length)
        inputs.extend([windows.ids[windows.bounds[w] : windows.bounds[w + 1]] for w in batch] for batch in hf._batches(windows.lengths))

    def run_hf() -> None:
        with torch.inference_mode():
            for batch in inputs:
                input_ids = torch.full((len(batch), len(batch[0])), hf.pad_id, dtype=torch.long)
                attention_mask = torch.zeros((len(batch), len(batch[0])), dtype=torch.long)
                for row, window in enumerate(batch):
                    input_ids[row, : len(window)] = torch.from_numpy(window)
                    attention_mask[row, : len(window)] = 1
                hf.model(input_ids=input_ids.to(hf.device), attention_mask=attention_mask.to(hf.device),
                         output_hidden_states=True, use_cache=False)

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


def profile(encoder: Encoder, chunks: list[list[Sentence]]) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds per stage, every stage in this thread: encode split into the model's forward
    (timed by hooks) and the rest, the commits, and finalize. CPU seconds count every thread of the
    process (torch's included), so under load they show the work a stage costs where wall seconds
    also show waiting for a core."""
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
            for sentences in chunks:
                forward[:] = [0.0, 0.0]
                encoded = run("rest of encode", lambda: encoder.encode(sentences, first_index=first))
                for column in (0, 1):
                    stages["forward pass"][column] += forward[column]
                    stages["rest of encode"][column] -= forward[column]
                run("commit", lambda: writer.commit(encoded, [s.text for s in sentences]))
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
    from lmgeom.corpus import Corpus, lee
    from lmgeom.encoders import load_encoder
    from lmgeom.runs import extract

    model, n_sentences, copies, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(threads)
    corpus = Corpus("lee-bench", list(lee().head(n_sentences).sentences) * copies)
    with tempfile.TemporaryDirectory() as out:
        extract(load_encoder(model, device="cpu"), corpus, out + "/store")
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    """
)


def peak_rss_mb(model: str, sentences: int, copies: int, threads: int) -> float:
    output = subprocess.run([sys.executable, "-c", MEMORY_WORKER, model, str(sentences), str(copies), str(threads)],
                            check=True, capture_output=True, text=True).stdout
    return float(json.loads(output.strip().splitlines()[-1])["peak_rss_mb"])


def alternate(encoder: Encoder, corpus: Corpus, chunks: list[list[Sentence]], repeat: int, n_words: int) -> None:
    """Bare forward and `lmgeom extract`, alternating `repeat` times after one warm-up each: wall
    seconds and their ratio, and the CPU seconds of the process (all threads), which under load
    still say how much work each side does."""
    modes = {"bare forward": bare_forward(encoder, chunks), "lmgeom extract": full_extract(encoder, corpus)}
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
    print(f"{repeat} alternating pairs, 1-min load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'':18}{'best s':>9}{'median s':>10}{'words/s (best)':>16}{'CPU s (median)':>16}")
    for mode, values in seconds.items():
        print(f"{mode:18}{min(values):>9.2f}{statistics.median(values):>10.2f}{n_words / min(values):>16,.0f}"
              f"{statistics.median(cpu[mode]):>16.2f}")
    bare, full = seconds["bare forward"], seconds["lmgeom extract"]
    print(f"ratio extract / bare forward: best {min(bare) / min(full):.2f}, median "
          f"{statistics.median(bare) / statistics.median(full):.2f} (goal >= 0.9); CPU seconds "
          f"{statistics.median(cpu['bare forward']) / statistics.median(cpu['lmgeom extract']):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="minilm, smollm2, elmo-brown, or any model load_encoder takes")
    parser.add_argument("--sentences", type=int, default=500, help="the first N sentences of the Lee corpus")
    parser.add_argument("--repeat", type=int, default=3, help="bare/extract pairs, alternating (0: the profile only)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory", action="store_true", help="also peak RSS for a 1x and a 10x corpus")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    encoder = load_encoder(args.model, device="cpu")
    corpus = lee().head(args.sentences)
    chunks = chunks_of(encoder, corpus)
    n_words = sum(len(s.words) for s in corpus.sentences)
    print(f"{args.model}: {len(corpus):,} Lee sentences ({n_words:,} words) in {len(chunks)} chunks, {args.threads} threads")
    if args.repeat:
        alternate(encoder, corpus, chunks, args.repeat, n_words)
    stages = profile(encoder, chunks)
    total = sum(wall for wall, _ in stages.values())
    print(f"\nprofile, stage by stage in one thread of control ({total:.2f} s, load {os.getloadavg()[0]:.1f}):")
    print(f"{'stage':18}{'wall s':>9}{'share':>8}{'CPU s':>9}")
    for stage, (wall, cpu) in stages.items():
        print(f"{stage:18}{wall:>9.2f}{wall / total:>8.1%}{cpu:>9.2f}")
    if isinstance(encoder, ElmoEncoder):
        print(f"of the bare forward: layers() stack {elmo_layers_stack_seconds(encoder, chunks):.2f} s "
              "(the baseline builds it; extract copies rows from the biLM outputs instead)")

    if args.memory:
        small, big = (peak_rss_mb(args.model, args.sentences, copies, args.threads) for copies in (1, 10))
        print(f"\npeak RSS of extract: 1x {small:,.0f} MB, 10x {big:,.0f} MB, ratio {big / small:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
