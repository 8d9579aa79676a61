"""Jobs in a background thread (pauliprop/runtime/background.py): one at a time per key (or one at all: alone),
joined by wait(), and a failure reported (a warning naming it) and forgotten, never raised into an unrelated
call."""

from __future__ import annotations

import logging
import threading

from pauliprop.runtime import background


def test_a_key_runs_one_job_at_a_time_and_wait_joins_them():
    gate, ran = threading.Event(), []
    started = background.started()
    assert background.start("k", lambda: gate.wait(30) and ran.append(1), "a job")
    assert background.running("k") and background.busy()
    assert not background.start("k", lambda: ran.append(2), "the same key")
    assert not background.start("other", lambda: ran.append(2), "another key, alone", alone=True)
    assert background.start("other", lambda: ran.append(3), "another key")
    assert not background.wait(0.05)  # "k" waits on the gate
    gate.set()
    assert background.wait(30) and sorted(ran) == [1, 3] and not background.running("k") and not background.busy()
    assert background.started() == started + 2
    assert background.start("k", lambda: ran.append(4), "the key again, once done") and background.wait(30)
    assert sorted(ran) == [1, 3, 4]


def test_a_failed_job_is_logged_by_name_and_forgotten(caplog):
    def fails():
        raise MemoryError("needs 2^40 slots")

    with caplog.at_level(logging.WARNING, logger="pauliprop"):
        assert background.start("failing", fails, "the GPU's first run") and background.wait(30)
    assert "the GPU's first run in the background failed: MemoryError: needs 2^40 slots" in caplog.text
    assert not background.running("failing")
    assert background.start("failing", lambda: None, "again") and background.wait(30)


def test_the_threads_are_not_daemons():
    """A process that ends while a job runs waits for it (its program is then stored), never tearing it down."""
    gate, seen = threading.Event(), []
    background.start("daemon?", lambda: seen.append(threading.current_thread().daemon) or gate.set(), "a job")
    assert gate.wait(30) and background.wait(30) and seen == [False]
