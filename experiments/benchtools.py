"""What every benchmark script records beside its figures: the machine, the versions, the command,
and what a process compiled."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import json
import logging
import os
import platform
import socket
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def version(dist: str) -> str | None:
    try:
        return _md.version(dist)
    except _md.PackageNotFoundError:
        return None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def environment(dists: tuple[str, ...]) -> dict:
    """Date, host, CPU, JAX device and the versions of `dists` (and of jax, jaxlib, numpy, pauliprop)."""
    import jax

    dev = jax.devices()[0]
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "load_average_1_5_15": load,
        "jax_backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "jax_enable_x64": bool(jax.config.jax_enable_x64),
        "python": sys.version.split()[0],
        "versions": {d: version(d) for d in ("jax", "jaxlib", "numpy", "pauliprop", *dists)},
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
    }


def default_out(name: str, backend: str) -> Path:
    """experiments/results/<name>_<backend>_<date>.json, not overwriting an earlier file."""
    day = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    base = REPO_ROOT / "experiments" / "results" / f"{name}_{backend}_{day}"
    out, i = base.with_suffix(".json"), 1
    while out.exists():
        out, i = Path(f"{base}_{i}.json"), i + 1
    return out


def write_result(result: dict, out: Path | None, name: str, backend: str) -> Path:
    """Write result as JSON to out (None: default_out(name, backend)), making its folder; say where."""
    out = Path(out) if out else default_out(name, backend)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return out


def child_record(cmd: list[str], timeout: float, env: dict, stderr_chars: int, **identity) -> dict:
    """Run a benchmark's child process and return the JSON object on the last line of its output that
    starts with "{"; if it fails or times out, a record of that (with `identity`, the tail of stderr).
    `process_s` is the child's wall time either way."""
    import subprocess
    import time

    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        record = json.loads(lines[-1]) if done.returncode == 0 and lines else dict(
            identity, status="failed", returncode=done.returncode, stderr=done.stderr[-stderr_chars:])
    except subprocess.TimeoutExpired:
        record = dict(identity, status="timed out", timeout_s=timeout)
    record["process_s"] = time.perf_counter() - t0
    return record


def git_state() -> dict:
    """The checkout's commit and the files that differ from it (results of a dirty tree say so)."""
    import subprocess

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.rstrip()
        except (OSError, subprocess.SubprocessError):
            return None

    status = git("status", "--short", "--", "pauliprop", "experiments")
    return {"commit": git("rev-parse", "HEAD"), "modified": status.splitlines() if status else []}


def pyplot():
    """matplotlib.pyplot on the headless Agg backend, or None when matplotlib is not installed (the
    plots are optional: every figure is also in the result file)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig, path) -> None:
    """Lay out, write (120 dpi) and close a figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def device_kernels(run, top: int = 25, bounds_us: tuple = ()) -> dict:
    """Run `run()` once under JAX's profiler and sum the device's kernels by name: the span (host wall
    time), the device's busy time, the kernel count, the device-to-host copies (each a wait for the
    host) and the `top` kernels as (name, ms, count); with bounds_us, also each top kernel's
    milliseconds and launches between consecutive bounds (by_duration: name -> [[ms, count], ...])."""
    import collections
    import glob
    import gzip
    import tempfile
    import time

    import jax

    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, create_perfetto_trace=True)
        t0 = time.perf_counter()
        run()
        span = time.perf_counter() - t0
        jax.profiler.stop_trace()
        trace = json.load(gzip.open(glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)[0]))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    device = [e for e in events if e.get("ph") == "X" and "GPU" in names.get(e.get("pid"), "")]
    by_name, count = collections.Counter(), collections.Counter()
    for e in device:
        by_name[e["name"][:60]] += e["dur"]
        count[e["name"][:60]] += 1
    copies = sum(c for name, c in count.items() if "memcpy" in name.lower() and ("dtoh" in name.lower() or "d2h" in name.lower()))
    out = {"profiled_span_s": span, "device_events": len(device), "device_busy_s": sum(e["dur"] for e in device) * 1e-6,
           "device_to_host_copies": copies,
           "top": [(name, round(t * 1e-3, 3), count[name]) for name, t in by_name.most_common(top)]}
    if bounds_us:
        edges = (0, *bounds_us, float("inf"))
        bins = collections.defaultdict(lambda: [[0.0, 0] for _ in range(len(edges) - 1)])
        for e in device:
            k = next(j for j in range(len(edges) - 1) if e["dur"] < edges[j + 1])
            bins[e["name"][:60]][k][0] += e["dur"] * 1e-3
            bins[e["name"][:60]][k][1] += 1
        out["bounds_us"] = list(bounds_us)
        out["by_duration"] = {name: [[round(ms, 3), c] for ms, c in bins[name]] for name, _ in by_name.most_common(top)}
    return out


def watch_compilations():
    """(compiles, hits, stages), filled as JAX works: the names of the programs it compiled or loaded,
    the persistent-cache hits among them (JAX logs a finished compilation for a hit too, and the hit),
    and the seconds spent tracing, lowering and compiling. Turns jax_log_compiles on."""
    import jax

    compiles, hits, stages = [], [], {"trace": 0.0, "lower": 0.0, "compile": 0.0}

    class Count(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            seconds = float(message.rsplit(" in ", 1)[1].split()[0]) if message.endswith(" sec") else 0.0
            if "Finished XLA compilation" in message:
                compiles.append(message.split(" of ")[1].split(" in ")[0])
                stages["compile"] += seconds
            elif "Finished tracing" in message:
                stages["trace"] += seconds
            elif "Finished jaxpr to MLIR" in message:
                stages["lower"] += seconds
            elif "Persistent compilation cache hit" in message:
                hits.append(message)

    logging.getLogger("jax").addHandler(Count())
    jax.config.update("jax_log_compiles", True)
    return compiles, hits, stages
