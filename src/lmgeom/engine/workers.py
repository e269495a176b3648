"""Worker processes that end with the process that started them and share its cores.

A pool's workers wait on a queue their parent feeds; killed (kill -9, the out-of-memory killer), the
parent never tells them to stop, and they would wait for ever. `die_with_parent`, called first in a
worker (the pool's initializer, through `start_worker`), ties the worker's life to its parent's.
`start_worker` also gives the worker its share of the cores (`lmgeom.threads.share_cores`).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import threading

from lmgeom.threads import ThreadShare, share_cores

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def start_worker(workers: int) -> ThreadShare:
    """What a pool's initializer does first in each of its `workers` processes: end with the parent
    (`die_with_parent`) and run torch and BLAS on 1 / `workers` of the cores (`share_cores`: with
    each pool's default of a thread per core, N workers would run N threads per core)."""
    die_with_parent()
    return share_cores(workers)


def die_with_parent() -> None:
    """End this multiprocessing child as soon as its parent process ends, however it ends.

    On Linux the kernel kills it (`prctl(PR_SET_PDEATHSIG, SIGKILL)`: sent when the parent's thread
    that started this process ends, which for a pool is the thread that runs it); elsewhere, or where
    prctl fails, a daemon thread waits on the parent's sentinel (the pipe multiprocessing keeps open
    to every child, at its end once the parent is gone) and then exits. A process that is not a
    multiprocessing child is left as it is."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    if sys.platform.startswith("linux") and _kernel_kills_on_parent_death():
        if os.getppid() != parent.pid:  # the parent ended before prctl took effect
            os._exit(1)
        return
    exit_when_parent_ends(parent)


def _kernel_kills_on_parent_death() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def exit_when_parent_ends(parent: multiprocessing.process.BaseProcess) -> threading.Thread:
    """The portable half of `die_with_parent`: a daemon thread that exits this process once `parent`
    (`multiprocessing.parent_process()`) has ended."""

    def watch() -> None:
        parent.join()  # returns once the parent's sentinel says it has ended
        os._exit(1)

    thread = threading.Thread(target=watch, name="lmgeom-parent-watch", daemon=True)
    thread.start()
    return thread
