"""Extraction and analysis seconds of two versions of lmgeom, side by side on the same machine.

A refactor of the driver must not slow the user's work. This script checks out a second version
(`--before`, any git revision, in a temporary worktree) and runs, in alternating fresh processes
(before, after, before, after, ...), the same two CLI calls a user makes:

    lmgeom extract MODEL --corpus lee [--limit N] --out TMP --device cpu
    lmgeom analyze TMP --device cpu --num-workers W --out TMP/analysis

Each call is timed inside its process (after the imports), wall and CPU seconds, so start-up cost
does not dilute the comparison. The table gives, per step and version, the median and range over
--repeat rounds, and the ratio after / before of the medians (goal: within 5 %).

    python benchmarks/engine_speed.py --before f2df823 --repeat 3
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The child process: runs the two CLI calls of one round in-process and prints their seconds.
CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    from lmgeom.cli.main import app
    model, limit, workers, tmp = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    cut = sys.argv.index("--analyze")
    extra, analyze_extra = sys.argv[5:cut], sys.argv[cut + 1:]
    def timed(args):
        cpu0 = time.process_time(); wall0 = time.perf_counter()
        children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            app(args, standalone_mode=False)
        finally:
            children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        child = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
        return time.perf_counter() - wall0, time.process_time() - cpu0 + child
    out = {}
    corpus = ["--corpus", "lee"] + (["--limit", limit] if limit != "0" else [])
    out["extract"] = timed(["extract", model, *corpus, "--out", tmp + "/store", "--device", "cpu", *extra])
    out["analyze"] = timed(["analyze", tmp + "/store", "--device", "cpu", "--num-workers", workers,
                            "--out", tmp + "/analysis", *analyze_extra])
    print("RESULT " + json.dumps(out))
    """
)


def one_round(src: Path, args: argparse.Namespace, extra: list[str], analyze_extra: list[str]) -> dict[str, tuple[float, float]]:
    """One fresh process of one version: its extract (with the flags `extra`) and analyze (with
    `analyze_extra`) seconds (wall, CPU)."""
    env = dict(os.environ, PYTHONPATH=str(src))
    with tempfile.TemporaryDirectory(prefix="lmgeom-speed-") as tmp:
        done = subprocess.run(
            [sys.executable, "-c", CHILD, args.model, str(args.limit), str(args.workers), tmp, *extra, "--analyze", *analyze_extra],
            env=env, capture_output=True, text=True, check=False,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the run of {src} failed:\n{done.stderr[-3000:]}")
    return {step: (float(v[0]), float(v[1])) for step, v in json.loads(lines[-1][7:]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git revision to compare with the working tree")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--limit", type=int, default=0, help="Lee sentences extracted and analysed (0: all)")
    parser.add_argument("--workers", type=int, default=2, help="--num-workers of the analysis")
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds (each runs both versions)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="also run the working tree's extraction with these flags (repeatable), "
                             "e.g. 'window1024=--sort-window 1024'")
    parser.add_argument("--after-analyze", default="", metavar="FLAGS",
                        help="flags of the working tree's analysis only (e.g. '--bootstrap 0': the work the older version does)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw seconds here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lmgeom-before-") as tree:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", tree, args.before],
                       check=True, capture_output=True)
        try:
            after = args.after_analyze.split()
            versions: dict[str, tuple[Path, list[str], list[str]]] = {
                "before": (Path(tree) / "src", [], []), "after": (ROOT / "src", [], after)}
            for variant in args.variant:
                name, _, flags = variant.partition("=")
                versions[name] = (ROOT / "src", flags.split(), after)
            runs: dict[str, list[dict[str, tuple[float, float]]]] = {name: [] for name in versions}
            for round_ in range(args.repeat):
                for name, (src, extra, analyze_extra) in versions.items():
                    runs[name].append(one_round(src, args, extra, analyze_extra))
                    shown = {step: f"{v[0]:.1f}" for step, v in runs[name][-1].items()}
                    print(f"round {round_ + 1} {name}: {shown}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tree], check=False)

    print(f"\n{args.model}, {args.limit or 'all'} Lee sentences, analysis with {args.workers} workers, "
          f"{args.repeat} alternating rounds (seconds: median [min–max]; CPU = this process + its workers)")
    print("| step | version | wall s | / before | CPU s | / before |")
    print("|---|---|---|---|---|---|")
    for step in ("extract", "analyze"):
        wall = {name: statistics.median(r[step][0] for r in runs[name]) for name in versions}
        cpu = {name: statistics.median(r[step][1] for r in runs[name]) for name in versions}
        for name in versions:
            walls = [r[step][0] for r in runs[name]]
            print(f"| {step} | {name} | {wall[name]:.2f} [{min(walls):.2f}–{max(walls):.2f}] | "
                  f"{wall[name] / wall['before']:.3f} | {cpu[name]:.2f} | {cpu[name] / cpu['before']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"options": vars(args) | {"json": str(args.json)}, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
