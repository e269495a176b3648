"""What the default bootstrap intervals cost: `lmgeom analyze STORE` with its default `--bootstrap
1000` against `--bootstrap 0`, in CPU seconds, on stores of several sizes.

Each run is a fresh process (`python -m lmgeom.cli.main analyze STORE --out TMP [--bootstrap B]`,
the command a user types, at the CLI's defaults otherwise); the runs of one store alternate (no
bootstrap, bootstrap, no bootstrap, ...) so a machine whose cores are shared with other jobs slows
both alike. Two figures per run, median of --repeat:
- process CPU s: user + system seconds of the whole command (imports included), from `getrusage`;
- analysis CPU s: the seconds of the analysis call itself, timed inside the process after the imports
  (`time.process_time` plus any worker processes).
`--before REV` also runs the default analysis of an older revision (in a temporary git worktree).

Run: OMP_NUM_THREADS=1 python benchmarks/bootstrap_cost.py --store lee500=STORE [--store lee=STORE2]
     [--repeat 3] [--before REV]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    from lmgeom.cli.main import app
    cpu0 = time.process_time()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        app(sys.argv[1:], standalone_mode=False)
    finally:
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        workers = (children1.ru_utime + children1.ru_stime) - (children0.ru_utime + children0.ru_stime)
        print("RESULT " + json.dumps(time.process_time() - cpu0 + workers))
    """
)


def one_run(src: Path, store: str, flags: list[str]) -> tuple[float, float]:
    """(process CPU s, analysis CPU s) of one `lmgeom analyze` in a fresh process of the code under `src`."""
    env = dict(os.environ, PYTHONPATH=str(src))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory(prefix="lmgeom-bootstrap-cost-") as tmp:
        done = subprocess.run([sys.executable, "-c", CHILD, "analyze", store, "--out", tmp + "/analysis", *flags],
                              env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"lmgeom analyze {store} {' '.join(flags)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    process = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return process, float(lines[-1][7:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", action="append", required=True, metavar="NAME=PATH", help="a store (repeatable)")
    parser.add_argument("--repeat", type=int, default=3, help="alternating rounds")
    parser.add_argument("--before", default=None, help="also time an older revision's default analysis")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw seconds here")
    args = parser.parse_args()
    stores = dict(entry.split("=", 1) for entry in args.store)

    tree = tempfile.mkdtemp(prefix="lmgeom-before-") if args.before else None
    if tree:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", tree, args.before], check=True, capture_output=True)
    versions = {"--bootstrap 0": (ROOT / "src", ["--bootstrap", "0"]), "default (--bootstrap 1000)": (ROOT / "src", [])}
    if tree:
        versions[f"default, {args.before}"] = (Path(tree) / "src", [])
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    try:
        for round_ in range(args.repeat):
            for name, store in stores.items():
                for version, (src, flags) in versions.items():
                    runs.setdefault((name, version), []).append(one_run(src, store, flags))
                    print(f"round {round_ + 1} {name} {version}: {runs[(name, version)][-1]}", flush=True)
    finally:
        if tree:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tree], check=False)

    print(f"\nlmgeom analyze STORE at the CLI's defaults; CPU seconds, median of {args.repeat} alternating rounds")
    print("| store | analysis | process CPU s | × no bootstrap | analysis CPU s | × no bootstrap |")
    print("|---|---|---:|---:|---:|---:|")
    for name in stores:
        base = [statistics.median(v[i] for v in runs[(name, "--bootstrap 0")]) for i in (0, 1)]
        for version in versions:
            values = [statistics.median(v[i] for v in runs[(name, version)]) for i in (0, 1)]
            print(f"| {name} | {version} | {values[0]:.2f} | {values[0] / base[0]:.2f} | {values[1]:.2f} | {values[1] / base[1]:.2f} |")
    if args.json:
        args.json.write_text(json.dumps({"stores": stores, "repeat": args.repeat, "before": args.before,
                                         "runs": {f"{n} | {v}": r for (n, v), r in runs.items()}}, indent=1))


if __name__ == "__main__":
    main()
