"""Seconds per fine-tuning step (MiniLM, batch 32, CoLA sentences) for several methods, interleaved.

Each repeat runs every method once, in turn (A, B, C, ..., A, B, C, ...), as one epoch of `--steps`
steps on a seeded sample of CoLA's in-domain training sentences, so machine load hits every method
alike. A step's time is the wall time between two progress reports of the training loop (forward,
backward, optimiser); re-estimating a calibrator (before step 0 here) and I-STAR's C0 (before the
epoch) are reported apart, as the extra seconds of the epoch over its steps.

Run: python benchmarks/finetune_steps.py [--model minilm] [--steps 8] [--repeats 3] [--methods none,whitening,isobn,istar]
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
    args = parser.parse_args()
    rows = [line.split("\t") for line in (DATA / "GLUE" / "CoLA" / "in_domain_train.tsv").read_text().splitlines()]
    sample = np.random.default_rng(0).choice(len(rows), size=args.steps * args.batch_size, replace=False)
    texts = [rows[i][3] for i in sample]
    labels = np.array([int(rows[i][1]) for i in sample])
    methods = args.methods.split(",")
    step_seconds: dict[str, list[float]] = {method: [] for method in methods}
    extra_seconds: dict[str, list[float]] = {method: [] for method in methods}
    print(f"load: {os.getloadavg()}, torch threads: {torch.get_num_threads()}")
    for _ in range(args.repeats):
        for method in methods:
            clock = StepClock()
            result = finetune(args.model, train_inputs=texts, train_labels=labels, eval_inputs={"dev": texts[:2]}, n_outputs=2,
                              method=method, options=FineTuneOptions(epochs=1, batch_size=args.batch_size, device="cpu"), progress=clock)
            steps = np.diff(clock.times).tolist()
            step_seconds[method].extend(steps)
            extra_seconds[method].append(result.seconds_per_epoch[0] - sum(steps))
    print(f"load after: {os.getloadavg()}")
    print("| method | median s/step | min s/step | extra s per epoch (refits, C0) |")
    print("| --- | --- | --- | --- |")
    for method in methods:
        print(f"| {method} | {statistics.median(step_seconds[method]):.2f} | {min(step_seconds[method]):.2f} | "
              f"{statistics.median(extra_seconds[method]):.1f} |")


if __name__ == "__main__":
    main()
