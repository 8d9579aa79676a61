"""Stabilizer benchmarks, side by side with Stim and QuaSARQ (issue 4).

Workloads:
  surface  detector sampling of the rotated surface code (Stim's generator, memory_z), distance d,
           d rounds, every noise knob at p; shots per tool; detector firing rates are recorded
           beside the times so a fast wrong answer shows.
  random   a random Clifford circuit in QuaSARQ's gate set (X Y Z H S S_DAG CX CY CZ SWAP ISWAP):
           `depth` layers, each qubit in one gate per layer; gates only (the tableau workload),
           optionally then measuring every qubit (--measure-all).

Tools: ours (defaults: the Pallas kernels that are on by default on GPUs), ours-jax (every kernel off,
STABILIZER_KERNEL=jax), stim, quasarq.
Each (tool, workload) runs in its own subprocess with a time limit, so a crash (QuaSARQ 1.7.2
aborts on some circuits) or a timeout is recorded as a result instead of ending the run.
Times: `first_s` is the first call (compiles included), `seconds` the best of the later calls.

Usage:
  python experiments/stabilizer_bench.py                      # all workloads, default sizes
  python experiments/stabilizer_bench.py --workloads surface --distances 5,11 --shots 100000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchtools  # noqa: E402  (experiments/benchtools.py)

QUASARQ_GATES_1Q = ["X", "Y", "Z", "H", "S", "S_DAG"]
QUASARQ_GATES_2Q = ["CX", "CY", "CZ", "SWAP", "ISWAP"]


def surface_circuit_text(d: int, p: float) -> str:
    import stim

    return str(stim.Circuit.generated("surface_code:rotated_memory_z", distance=d, rounds=d,
                                      after_clifford_depolarization=p, before_measure_flip_probability=p,
                                      after_reset_flip_probability=p, before_round_data_depolarization=p))


def random_layers(n: int, depth: int, seed: int):
    """Layers of random gates, vectorised: each layer shuffles the qubits, pairs half of them into
    random two-qubit gates and gives the rest random one-qubit gates. Yields (gate, targets) per
    instruction, one instruction per gate kind per layer, and "TICK" between layers."""
    rng = np.random.default_rng(seed)
    m = n // 4  # pairs
    for _ in range(depth):
        perm = rng.permutation(n)
        pairs, singles = perm[: 2 * m].reshape(m, 2), perm[2 * m:]
        kind2, kind1 = rng.integers(len(QUASARQ_GATES_2Q), size=m), rng.integers(len(QUASARQ_GATES_1Q), size=len(singles))
        for g, name in enumerate(QUASARQ_GATES_2Q):
            yield name, pairs[kind2 == g].ravel()
        for g, name in enumerate(QUASARQ_GATES_1Q):
            yield name, singles[kind1 == g]
        yield "TICK", None


def random_circuit(n: int, depth: int, seed: int, measure_all: bool, text: bool):
    """The random workload as Stim circuit text (text=True) or as a stabilizer.Circuit built from
    arrays (the same instructions, without printing and parsing a gigabyte of text at 1.8e5 qubits)."""
    if text:
        lines = [name if ts is None else name + " " + " ".join(map(str, ts.tolist()))
                 for name, ts in random_layers(n, depth, seed) if ts is None or ts.size]
        if measure_all:
            lines.append("M " + " ".join(map(str, range(n))))
        return "\n".join(lines)
    import stabilizer as st

    c = st.Circuit()
    for name, ts in random_layers(n, depth, seed):
        if ts is None or ts.size:
            c.append(name, () if ts is None else ts)
    if measure_all:
        c.append("M", np.arange(n))
    return c


# ---- one tool on one workload (runs in a subprocess) -------------------------------------------------

def _detector_sampler(tool: str, text: str):
    """Each tool's compiled detector sampler for circuit text (seed 1), through its own API."""
    if tool.startswith("ours"):
        import stabilizer as st

        return st.compile_detector_sampler(st.Circuit(text), seed=1)
    if tool == "stim":
        import stim

        return stim.Circuit(text).compile_detector_sampler(seed=1)
    import quasarq

    return quasarq.compile_detector_sampler(text, seed=1)


def _timed(fn, repeats: int):
    t0 = time.perf_counter()
    out = fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, first, (min(times) if times else first), times


def worker(spec: dict) -> dict:
    tool, kind = spec["tool"], spec["workload"]
    if kind == "surface":
        text = surface_circuit_text(spec["d"], spec["p"])
        shots = spec["shots"]
        t0 = time.perf_counter()
        sampler = _detector_sampler(tool, text)
        compile_s = time.perf_counter() - t0

        def run():
            return sampler.sample(shots, separate_observables=True)

        (dets, obs), first, best, times = _timed(run, spec["repeats"])
        dets, obs = np.asarray(dets), np.asarray(obs)
        return {"compile_s": compile_s, "first_s": first, "seconds": best, "times": times,
                "detector_rate": float(dets.mean()), "observable_rate": float(obs.mean()),
                "num_detectors": int(dets.shape[1]), "shots": shots}
    t0 = time.perf_counter()
    built = random_circuit(spec["n"], spec["depth"], spec["seed"], spec["measure_all"], text=not tool.startswith("ours"))
    build_s = time.perf_counter() - t0
    if tool.startswith("ours"):
        import jax
        import stabilizer as st

        circuit = built

        def run():
            sim = st.TableauSimulator(seed=0, num_qubits=spec["n"])
            sim.do(circuit)
            jax.block_until_ready(sim._tableau)
            return sim
    elif tool == "stim":
        import stim

        circuit = stim.Circuit(built)

        def run():
            sim = stim.TableauSimulator(seed=0)
            sim.do(circuit)
            return sim
    else:
        import quasarq

        circuit = quasarq.Circuit(built)

        def run():
            return quasarq.simulate(circuit)
    _, first, best, times = _timed(run, spec["repeats"])
    return {"build_s": build_s, "first_s": first, "seconds": best, "times": times}


def run_isolated(spec: dict, timeout: float) -> dict:
    """Run `worker(spec)` in a subprocess; a crash or timeout becomes the record."""
    t0 = time.perf_counter()
    env = os.environ | ({"STABILIZER_KERNEL": "jax"} if spec["tool"] == "ours-jax" else {})
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**spec, "status": f"timeout after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {**spec, "status": f"failed (exit {proc.returncode})", "error": " | ".join(tail), "wall_s": wall}
    return {**spec, "status": "ok", **json.loads(lines[-1][len("RESULT "):]), "wall_s": wall}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--workloads", default="surface,random")
    ap.add_argument("--tools", default="ours,stim,quasarq")
    ap.add_argument("--distances", default="5,11,13,17,21,25")
    ap.add_argument("--p", type=float, default=1e-3)
    ap.add_argument("--shots", type=float, default=1e5)
    ap.add_argument("--qubits", default="1000,5000,20000,30000")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--measure-all", action="store_true")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    import jax

    tools = args.tools.split(",")
    out = args.out or benchtools.default_out("stabilizer", jax.default_backend())
    meta = benchtools.environment(("stim", "quasarq"))
    meta["args"] = vars(args) | {"out": str(out)}
    records = []

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta, "records": records}, indent=1))

    specs = []
    if "surface" in args.workloads:
        for d in map(int, args.distances.split(",")):
            specs += [{"tool": t, "workload": "surface", "d": d, "p": args.p, "shots": int(args.shots),
                       "repeats": args.repeats} for t in tools]
    if "random" in args.workloads:
        for n in map(int, args.qubits.split(",")):
            specs += [{"tool": t, "workload": "random", "n": n, "depth": args.depth, "seed": 0,
                       "measure_all": args.measure_all, "repeats": args.repeats} for t in tools]
    for spec in specs:
        r = run_isolated(spec, args.timeout)
        records.append(r)
        save()
        size = f"d={r['d']}" if r["workload"] == "surface" else f"n={r['n']}"
        fig = (f"{r['seconds']:.3f} s (first {r['first_s']:.2f} s)" if r["status"] == "ok" else r["status"])
        extra = f" rate {r['detector_rate']:.4f}" if r.get("detector_rate") is not None else ""
        print(f"{r['workload']:8s} {size:8s} {r['tool']:8s} {fig}{extra}", flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
