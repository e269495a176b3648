"""Seconds per fine-tuning step (MiniLM, batch 32, CoLA sentences) for several methods, interleaved.

Each repeat runs every method once, in turn (A, B, C, ..., A, B, C, ...), as one epoch of `--steps`
steps on a seeded sample of CoLA's in-domain training sentences, so machine load hits every method
alike. A step's time is the wall time between two progress reports of the training loop (forward,
backward, optimiser); re-estimating a calibrator (before step 0 here) and I-STAR's C0 (before the
epoch) both happen inside the first step's interval and are reported apart, as the first step's
time minus the median of the others. `--threads 1,2` adds torch's intra-op thread count to the
interleaving.

Run: python benchmarks/finetune_steps.py [--model minilm] [--steps 8] [--repeats 3] [--methods none,whitening,isobn,istar] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from lmgeom.finetune import FineTuneOptions, finetune

DATA = Path(os.environ.get("LMGEOM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


class StepClock:
    """A Progress that keeps the time of every training step's report."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def start(self, stage: str, total: int, *, unit: str = "items") -> None:
        if stage == "fine-tuning":
            self.times = [time.perf_counter()]

    def advance(self, stage: str, n: int = 1, *, note: str = "") -> None:
        if stage == "fine-tuning":
            self.times.append(time.perf_counter())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--methods", default="none,whitening,isobn,istar")
    parser.add_argument("--threads", default=str(torch.get_num_threads()))
    args = parser.parse_args()
    rows = [line.split("\t") for line in (DATA / "GLUE" / "CoLA" / "in_domain_train.tsv").read_text().splitlines()]
    sample = np.random.default_rng(0).choice(len(rows), size=args.steps * args.batch_size, replace=False)
    texts = [rows[i][3] for i in sample]
    labels = np.array([int(rows[i][1]) for i in sample])
    cells = [(method, int(threads)) for threads in args.threads.split(",") for method in args.methods.split(",")]
    step_seconds: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
    extra_seconds: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
    print(f"load before: {os.getloadavg()}")
    for _ in range(args.repeats):
        for method, threads in cells:
            torch.set_num_threads(threads)
            clock = StepClock()
            finetune(args.model, train_inputs=texts, train_labels=labels, eval_inputs={"dev": texts[:2]}, n_outputs=2,
                     method=method, options=FineTuneOptions(epochs=1, batch_size=args.batch_size, device="cpu"), progress=clock)
            steps = np.diff(clock.times).tolist()
            step_seconds[method, threads].extend(steps[1:])
            extra_seconds[method, threads].append(steps[0] - statistics.median(steps[1:]))
    print(f"load after: {os.getloadavg()}")
    print("| method | torch threads | median s/step | min s/step | before the first step (refit, C0), s |")
    print("| --- | --- | --- | --- | --- |")
    for method, threads in cells:
        print(f"| {method} | {threads} | {statistics.median(step_seconds[method, threads]):.2f} | "
              f"{min(step_seconds[method, threads]):.2f} | {statistics.median(extra_seconds[method, threads]):.1f} |")


if __name__ == "__main__":
    main()
