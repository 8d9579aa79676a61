"""Work a thread does while the caller already has its answer: compiling a GPU program in the background.

A GPU's first call with an empty compilation cache waits seconds for XLA (tracing, lowering, compiling);
the host's native engine answers the same call in a fraction of that. propagate.py then answers on the
host and starts the GPU's run here, in a thread, so that the program is compiled (and stored) and the
next call runs on the GPU. At most one job per key runs at once; a job that fails is logged (its error
is raised again by the next call, which runs in the foreground) and forgotten.

The threads are not daemons: a process that ends while one compiles waits for it (its program is then
stored for the next process), rather than being torn down inside XLA. `wait()` joins them (a benchmark
that wants the GPU's warm call, a test).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Hashable

_log = logging.getLogger("pauliprop")
_LOCK = threading.Lock()
_RUNNING: dict[Hashable, threading.Thread] = {}
_STARTED = [0]  # jobs started in this process


def running(key: Hashable) -> bool:
    """Whether a job of this key is running now."""
    with _LOCK:
        thread = _RUNNING.get(key)
        return thread is not None and thread.is_alive()


def busy() -> bool:
    """Whether any job is running now."""
    with _LOCK:
        return any(t.is_alive() for t in _RUNNING.values())


def start(key: Hashable, job: Callable[[], object], what: str, alone: bool = False) -> bool:
    """Run job() in a new thread unless one of this key runs (alone: unless any job runs); returns whether it
    started one."""
    with _LOCK:
        if (key in _RUNNING and _RUNNING[key].is_alive()) or (alone and any(t.is_alive() for t in _RUNNING.values())):
            return False

        def work():
            try:
                job()
            except BaseException as error:  # noqa: BLE001  reported; the next call meets it in the foreground
                _log.warning("pauliprop: %s in the background failed: %s: %s", what, type(error).__name__, error)
            finally:
                with _LOCK:
                    if _RUNNING.get(key) is threading.current_thread():
                        del _RUNNING[key]

        thread = threading.Thread(target=work, name=f"pauliprop: {what}")
        _RUNNING[key] = thread
        _STARTED[0] += 1
    thread.start()
    return True


def started() -> int:
    """How many background jobs this process has started."""
    return _STARTED[0]


def wait(timeout: float | None = None) -> bool:
    """Join the running jobs (at most `timeout` seconds in all); returns whether none is left running."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        with _LOCK:
            threads = [t for t in _RUNNING.values() if t.is_alive()]
        if not threads:
            return True
        left = None if end is None else end - time.monotonic()
        if left is not None and left <= 0:
            return False
        threads[0].join(left)
