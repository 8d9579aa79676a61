"""Warm detector sampling of two or more versions of `stabilizer`, side by side in one process, for
machines shared with other jobs.

On the 2-core CPU the other engineers' jobs move a sample's wall time by 1.5-2x from minute to minute,
so separate processes run minutes apart (stabilizer_bench.py) cannot tell a 10% change. Here every
version's sampler lives in the same process and their calls alternate, round after round, so that
load drifts hit all of them alike; each call's wall time and the process's CPU time (all threads)
are recorded, and the summary gives their minimum and median per version.

Versions are git commits (or `work`, the working tree): each commit's `stabilizer/` is exported
(git archive) into a temporary folder under the name stabilizer_<label>, so that all import side by
side (pauliprop, imported for the gate table, is the working tree's for all of them).

    python experiments/stabilizer_ab.py --versions 687ba2c^,HEAD,work --d 9 --p 1e-2 --shots 1e5 --rounds 12

Writes experiments/results/stabilizer_ab_<backend>_<date>.json (hardware, date, load, commits).
"""

from __future__ import annotations

import argparse
import importlib
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchtools  # noqa: E402  (experiments/benchtools.py)
from stabilizer_bench import surface_circuit_text  # noqa: E402

ROOT = benchtools.REPO_ROOT


def export(commit: str, label: str, into: Path) -> str:
    """Export `stabilizer/` of a commit as the package stabilizer_<label> under `into`; its full hash."""
    full = subprocess.run(["git", "rev-parse", commit], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "stabilizer"], cwd=ROOT, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into / label, filter="data")
    (into / label / "stabilizer").rename(into / f"stabilizer_{label}")
    return full.strip()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", default="HEAD,work", help="comma-separated git commits, `work` the working tree")
    ap.add_argument("--d", type=int, default=9)
    ap.add_argument("--p", type=float, default=1e-2)
    ap.add_argument("--shots", type=float, default=1e5)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    import jax

    shots, text = int(args.shots), surface_circuit_text(args.d, args.p)
    tmp = Path(tempfile.mkdtemp(prefix="stabilizer_ab_"))
    sys.path.insert(0, str(tmp))
    commits, samplers = {}, {}
    for i, version in enumerate(args.versions.split(",")):
        label = f"v{i}"
        if version == "work":
            module, commits[version] = importlib.import_module("stabilizer"), "working tree"
        else:
            commits[version] = export(version, label, tmp)
            module = importlib.import_module(f"stabilizer_{label}")
        t0 = time.perf_counter()
        s = module.compile_detector_sampler(module.Circuit(text), seed=1)
        s.sample(shots, separate_observables=True, bit_packed=True)
        samplers[version] = (s, time.perf_counter() - t0)
    calls = {v: [] for v in samplers}
    for _ in range(args.rounds):
        for v, (s, _) in samplers.items():
            t0, c0 = time.perf_counter(), time.process_time()
            s.sample(shots, separate_observables=True, bit_packed=True)
            calls[v].append((time.perf_counter() - t0, time.process_time() - c0))
    rows = {}
    for v, xs in calls.items():
        wall, cpu = [x[0] for x in xs], [x[1] for x in xs]
        rows[v] = {"commit": commits[v], "first_call_s": samplers[v][1], "wall_min_s": min(wall),
                   "wall_median_s": statistics.median(wall), "cpu_min_s": min(cpu), "cpu_median_s": statistics.median(cpu),
                   "wall_s": wall, "cpu_s": cpu}
        print(f"{v:12s} wall min {min(wall):.3f} median {statistics.median(wall):.3f} s   "
              f"cpu min {min(cpu):.3f} median {statistics.median(cpu):.3f} s")
    meta = benchtools.environment(("stim",))
    result = {"meta": meta, "workload": {"d": args.d, "rounds": args.d, "p": args.p, "shots": shots,
                                          "layout": "bit_packed, separate_observables, to the host"},
              "versions": rows}
    benchtools.write_result(result, args.out, "stabilizer_ab", jax.default_backend())


if __name__ == "__main__":
    main()
