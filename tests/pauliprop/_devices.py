"""Running a test module's script on 4 forced CPU host devices (in a subprocess: JAX fixes its device
count when it starts), once a test session: pytest-xdist workers that get tests of the module share
the result through a lock and a file in the session's temporary folder."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def forced_devices_result(script: str, name: str, tmp_path_factory) -> dict:
    """The JSON the script prints after "RESULT " (it must force 4 host devices and report them as
    "devices"), run once a session under `name`."""
    folder = tmp_path_factory.getbasetemp()
    folder = folder.parent if os.environ.get("PYTEST_XDIST_WORKER") else folder
    path = folder / f"{name}_result.json"
    with open(folder / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                       JAX_PLATFORMS="cpu")
            proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
            assert proc.returncode == 0, proc.stderr[-3000:]
            line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))
            path.write_text(line[len("RESULT "):])
        out = json.loads(path.read_text())
    assert out["devices"] == 4, "forcing 4 host devices did not take"
    return out
