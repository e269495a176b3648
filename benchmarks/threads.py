"""Thread caps (`lmgeom.threads`) against the libraries' defaults, on idle cores and beside busy processes.

Two commands:

- `pools`: for each workload (a flow fit, whitening fits, an analysis with 2 workers, an extraction), run
  in a fresh process, the thread pools `threadpoolctl` finds and each thread's CPU seconds during the
  work: which pools hold threads, and which of them run at the same time (threads are named by the pool
  that started them; `python` = started during the work, `child` = a worker process's thread).
- `time` (the default): seconds of each job with and without the cap, the variants alternating within
  each round, each job in a fresh process; the table gives the median and the range over --repeat rounds.
  `as is` runs the job on the CPU as it is (idle, or shared with whatever else runs); `busy` adds --hogs
  busy-loop processes at `nice 19` beside the job (the measured job is not niced).

Jobs and variants:
- flow d=128 / d=384: `FlowCalibrator(device="cpu", n_epochs=1)` on --flow-rows seeded Gaussian rows
  + 0.5. `default`: the libraries' thread defaults; `cap`: the BLAS pools at 1 thread during the fit
  (the flow trains in torch's pool); `1 thread`: OMP_NUM_THREADS=1.
- analysis: `analyze_store(num_workers=2, device="cpu")` of a synthetic store (2 layers of
  --analysis-rows rows at d = 384, every layer in a worker). `default`: OMP_NUM_THREADS and
  OPENBLAS_NUM_THREADS set to the cores, the libraries' defaults, which `share_cores` keeps; `cap`: each
  worker on its share (`lmgeom.engine.workers.start_worker`: cores / 2 threads for torch and BLAS).

Run: python benchmarks/threads.py [time|pools] [--repeat 3] [--hogs 2] [--flow-rows 10000] [--analysis-rows 30000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from lmgeom.threads import available_cores

TIMEOUT_S = 300.0  # a run past this is recorded as "> 300"


# ---------------------------------------------------------------------------------------------
# the jobs, each run in a fresh process: `python threads.py job NAME VARIANT ...`


def _gaussian(rows: int, dim: int) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((rows, dim)) + 0.5


def flow_job(dim: int, rows: int, variant: str) -> float:
    from threadpoolctl import threadpool_limits

    from lmgeom.calibrate.flow import FlowCalibrator

    X = _gaussian(rows, dim)
    started = time.perf_counter()
    if variant == "cap":
        with threadpool_limits(limits=1, user_api="blas"):
            FlowCalibrator(device="cpu", n_epochs=1).fit(X)
    else:
        FlowCalibrator(device="cpu", n_epochs=1).fit(X)
    return time.perf_counter() - started


def write_analysis_store(path: Path, rows: int) -> None:
    from lmgeom.store import write_store_from_arrays

    rng = np.random.default_rng(0)
    words = [f"w{i % 500}" for i in range(rows)]
    sentences = [words[start:start + 10] for start in range(0, rows, 10)]
    layers = [(rng.standard_normal((rows, 384)) + 1).astype(np.float32) for _ in range(2)]
    write_store_from_arrays(path, layers, sentences)


def analysis_job(store: str) -> float:
    import lmgeom.stages.analysis as analysis

    analysis.POOL_MIN_LAYER_VALUES = 0  # a worker per layer, whatever the store's size
    started = time.perf_counter()
    analysis.analyze_store(store, num_workers=2, device="cpu")
    return time.perf_counter() - started


def run_job(argv: list[str]) -> None:
    name, variant = argv[0], argv[1]
    if name.startswith("flow"):
        seconds = flow_job(int(name.split("-")[1]), int(argv[2]), variant)
    else:
        seconds = analysis_job(argv[2])
    print(json.dumps({"seconds": seconds}))


def variant_env(variant: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")}
    if variant == "1 thread":
        env["OMP_NUM_THREADS"] = "1"
    elif variant == "default (explicit)":
        env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(available_cores())
    return env


def timed(job: list[str], variant: str) -> float:
    command = [sys.executable, __file__, "job", job[0], variant.split(" ")[0], *job[1:]]
    try:
        done = subprocess.run(command, env=variant_env(variant), capture_output=True, text=True, timeout=TIMEOUT_S, check=True)
    except subprocess.TimeoutExpired:
        return float("inf")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def hog() -> None:
    while True:
        pass


def time_command(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        store = str(Path(scratch) / "store")
        write_analysis_store(Path(store), args.analysis_rows)
        jobs: dict[str, tuple[list[str], tuple[str, ...]]] = {
            "flow d=128": (["flow-128", str(args.flow_rows)], ("default", "cap", "1 thread")),
            "flow d=384": (["flow-384", str(args.flow_rows)], ("default", "cap", "1 thread")),
            "analysis, 2 workers": (["analysis", store], ("default (explicit)", "cap")),
        }
        seconds: dict[tuple[str, str, str], list[float]] = {}
        loads: dict[tuple[str, str, str], list[float]] = {}
        for round_ in range(args.repeat):
            for condition in ("as is", "busy"):
                hogs = []
                if condition == "busy":
                    hogs = [subprocess.Popen(["nice", "-n", "19", sys.executable, __file__, "hog"]) for _ in range(args.hogs)]
                    time.sleep(2)
                try:
                    for name, (job, variants) in jobs.items():
                        for variant in variants if round_ % 2 == 0 else variants[::-1]:
                            key = (condition, name, variant)
                            loads.setdefault(key, []).append(os.getloadavg()[0])
                            seconds.setdefault(key, []).append(timed(job, variant))
                            print(f"round {round_ + 1} {condition:5s} {name:20s} {variant:19s} "
                                  f"{seconds[key][-1]:8.2f} s  load {loads[key][-1]:.1f}", flush=True)
                finally:
                    for process in hogs:
                        process.kill()
                        process.wait()
    print(f"\nseconds, median (min-max) of {args.repeat} rounds; {available_cores()} cores; busy = {args.hogs} busy "
          f"processes at nice 19; flow: {args.flow_rows} rows, 1 epoch; analysis: 2 layers of {args.analysis_rows} rows, d = 384")
    print("| job | CPU | variant | seconds | load average (1 min) at the starts |")
    print("|---|---|---|---:|---:|")
    for (condition, name, variant), values in seconds.items():
        load = loads[(condition, name, variant)]
        print(f"| {name} | {condition} | {variant} | {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}) "
              f"| {min(load):.1f}-{max(load):.1f} |")


# ---------------------------------------------------------------------------------------------
# pools: which thread pools a workload holds, and which threads spend CPU


def _thread_ids() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _name_new_threads(before: set[int], label: str) -> set[int]:
    """Name the threads started since `before` (Linux: /proc/self/task/TID/comm) by their pool."""
    now = _thread_ids()
    for tid in now - before:
        Path(f"/proc/self/task/{tid}/comm").write_text(label)
    return now


def _sample_threads(stop: threading.Event, seen: dict[tuple[str, int, int], tuple[str, float, float]]) -> None:
    """Every 50 ms, each thread's name and CPU seconds (its first and latest), in this process and its children."""
    import psutil

    me = psutil.Process()
    tick = os.sysconf("SC_CLK_TCK")
    while not stop.is_set():
        for process in [me, *me.children(recursive=True)]:
            where = "self" if process.pid == me.pid else "child"
            try:
                tids = os.listdir(f"/proc/{process.pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    comm, rest = Path(f"/proc/{process.pid}/task/{tid}/stat").read_text().split("(", 1)[1].rsplit(")", 1)
                except OSError:
                    continue
                fields = rest.split()
                cpu = (int(fields[11]) + int(fields[12])) / tick
                first = seen.get((where, process.pid, int(tid)), ("", cpu, cpu))[1]
                seen[(where, process.pid, int(tid))] = (comm, first, cpu)
        time.sleep(0.05)


def pools_workload(name: str, scratch: Path) -> None:
    if name == "flow fit":
        from lmgeom.calibrate.flow import FlowCalibrator

        FlowCalibrator(device="cpu", n_epochs=1).fit(_gaussian(10000, 128))
    elif name == "whitening fits":
        from lmgeom.calibrate.linear import Whitening

        X = _gaussian(20000, 384)
        for _ in range(5):
            Whitening().fit(X)
    elif name == "analysis, 2 workers":
        write_analysis_store(scratch / "store", 30000)
        analysis_job(str(scratch / "store"))
    elif name == "extraction":
        from lmgeom.stages import extract_model

        extract_model("tiny-bert", "lee", out=scratch / "extracted", device="cpu", limit=100)


def pools_one(name: str) -> None:
    """In this fresh process: start each pool in turn (naming its threads), then run the workload."""
    known = _name_new_threads({os.getpid()}, "numpy-blas")  # numpy's OpenBLAS started its threads on import
    import scipy.linalg

    scipy.linalg.eigh(np.eye(300))
    known = _name_new_threads(known, "scipy-blas")
    import torch

    torch.ones(1000, 1000) @ torch.ones(1000, 1000)
    known = _name_new_threads(known, "torch-omp")
    stop, seen = threading.Event(), {}  # type: ignore[var-annotated]
    sampler = threading.Thread(target=_sample_threads, args=(stop, seen), daemon=True)
    sampler.start()
    time.sleep(0.2)
    _name_new_threads(known, "sampler")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        pools_workload(name, Path(scratch))
    seconds = time.perf_counter() - started
    stop.set()
    sampler.join()
    from threadpoolctl import threadpool_info

    pools = ", ".join(f"{pool['internal_api']} {Path(pool['filepath']).name.split('-')[0].split('.')[0]} x{pool['num_threads']}"
                      for pool in threadpool_info())
    processes = {(where, pid) for where, pid, _ in seen}
    print(f"{name}: {seconds:.1f} s, load {os.getloadavg()[0]:.1f}; torch {torch.get_num_threads()} threads; pools: {pools}")
    for where, pid in sorted(processes):
        threads = sorted(((comm, cpu - first) for (w, p, _), (comm, first, cpu) in seen.items() if (w, p) == (where, pid)),
                         key=lambda row: -row[1])
        busy = ", ".join(f"{comm} {cpu:.2f}" for comm, cpu in threads if cpu >= 0.05)
        print(f"  {where} process: {len(threads)} threads; CPU seconds: {busy}")


def pools_command(args: argparse.Namespace) -> None:
    for name in ("flow fit", "whitening fits", "analysis, 2 workers", "extraction"):
        done = subprocess.run([sys.executable, __file__, "pools-one", name], capture_output=True, text=True, check=True)
        print(done.stdout, end="", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("job", "hog", "pools-one"):
        command, rest = sys.argv[1], sys.argv[2:]
        if command == "job":
            run_job(rest)
        elif command == "hog":
            hog()
        else:
            pools_one(rest[0])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs="?", default="time", choices=("time", "pools"))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--flow-rows", type=int, default=10000)
    parser.add_argument("--analysis-rows", type=int, default=30000)
    args = parser.parse_args()
    time_command(args) if args.command == "time" else pools_command(args)


if __name__ == "__main__":
    main()
