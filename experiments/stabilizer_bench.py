"""Stabilizer benchmarks, side by side with Stim, QuaSARQ and NVIDIA cuStabilizer (issue 4).

Workloads:
  surface  detector sampling of the rotated surface code (Stim's generator, memory_z), distance d,
           d rounds, every noise knob at p, for each shot count; detector firing rates are recorded
           beside the times so a fast wrong answer shows. Each tool is timed in every output mode it
           has: `bool_host_s` (Stim's default: (shots, detectors) bool on the host; also `seconds`),
           `packed_host_s` (bit_packed=True on the host), `device_s` (results left on the device:
           ours with on_device=True, bit-packed, blocked until ready; cuStabilizer's bit-packed record
           as a CuPy array) and, for ours, `device_bool_s`. Ours also records `stages`, where a
           chunk's time goes: the frame program, the detector XOR, the transpose to shot-major
           (packed and bool), and the copies to the host.
  random   a random Clifford circuit in QuaSARQ's gate set (X Y Z H S S_DAG CX CY CZ SWAP ISWAP):
           `depth` layers, each qubit in one gate per layer; gates only (the tableau workload),
           optionally then measuring every qubit (--measure-all).

Tools: ours (defaults: the Pallas kernels that are on by default on GPUs, the C engine that is on by
default on CPUs; `engine` records which ran the samplers), ours-jax (every kernel off and the C engine
off, STABILIZER_KERNEL=jax STABILIZER_NATIVE=0: the JAX programs), ours-slots (a MEASURE op one collapse
at a time, as before issue 18's measurement blocks: STABILIZER_MEASURE=slots), stim, quasarq (tableau workloads: `simulate(...)` then `.measurements()`, since
QuaSARQ simulates only when a result is asked for), custabilizer (cuquantum.stabilizer.FrameSimulator: frame
simulation of the circuit text, the measurement record as flips; detector rates from it through
Stim's m2d converter; `unavailable` where cuquantum does not import).
Each (tool, workload) runs in its own subprocess with a time limit, so a crash (QuaSARQ 1.7.2
aborts on some circuits) or a timeout is recorded as a result instead of ending the run.
Times: `first_s` is the first call (compiles included), `seconds` the best of the later calls.

Usage:
  python experiments/stabilizer_bench.py                      # all workloads, default sizes
  python experiments/stabilizer_bench.py --workloads surface --distances 5,11 --shots 1e5,1e6
  python experiments/stabilizer_bench.py --workloads surface --distances 3 --shots 1000   # a CPU check
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
    """Each tool's compiled detector sampler for circuit text (seed 1), through its own API (Stim's)."""
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
        out = None  # free the last output first (a d = 25 bool sample of 1e6 shots is 16 GB)
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return out, first, (min(times) if times else first), times


def _rates(dets, obs) -> dict:
    dets, obs = np.asarray(dets), np.asarray(obs)
    return {"detector_rate": float(dets.mean()), "observable_rate": float(obs.mean()),
            "num_detectors": int(dets.shape[1])}


def _counts(text: str) -> tuple:
    from stabilizer.circuits.circuit import Circuit

    c = Circuit(text)
    return c.num_detectors, c.num_observables


def surface_worker(tool: str, spec: dict) -> dict:
    """Time each output mode of one tool's detector sampler on the surface code (see the docstring)."""
    text = surface_circuit_text(spec["d"], spec["p"])
    shots, repeats = spec["shots"], spec["repeats"]
    if tool == "custabilizer":
        return custabilizer_surface(text, shots, repeats)
    t0 = time.perf_counter()
    sampler = _detector_sampler(tool, text)
    out = {"compile_s": time.perf_counter() - t0, "shots": shots}
    if tool.startswith("ours"):
        out["engine"] = sampler.engine  # "native" (the C engine, CPUs) or "jax"
    modes = {"bool_host": lambda: sampler.sample(shots, separate_observables=True)}
    if tool != "quasarq":
        modes["packed_host"] = lambda: sampler.sample(shots, separate_observables=True, bit_packed=True)
    if tool.startswith("ours"):
        import jax

        modes["device"] = lambda: jax.block_until_ready(
            sampler.sample(shots, separate_observables=True, bit_packed=True, on_device=True))
        modes["device_bool"] = lambda: jax.block_until_ready(
            sampler.sample(shots, separate_observables=True, on_device=True))
    modes = {m: fn for m, fn in modes.items() if m in spec.get("modes", modes)}
    for i, (mode, fn) in enumerate(modes.items()):
        result, first, best, times = _timed(fn, repeats)
        out |= {f"{mode}_s": best, f"{mode}_first_s": first, f"{mode}_times": times}
        if mode == "bool_host":
            out |= _rates(*result) | {"seconds": best, "first_s": first, "times": times}
        elif mode == "packed_host" and "bool_host" not in modes:  # rates from the first 10,000 shots
            out |= _rates(*(np.unpackbits(np.asarray(r)[:10_000], axis=1, count=n, bitorder="little")
                            for r, n in zip(result, _counts(text))))
        del result
    if tool.startswith("ours"):
        out["stages"] = ours_stages(sampler, shots, repeats)
    return out


def ours_stages(sampler, shots: int, repeats: int) -> dict:
    """Best times of the steps of one full chunk (`chunk_shots` shots; `chunks` of them make `shots`) of
    our detector sampler, each blocked until ready: the frame program, the detector XOR, the transpose
    to shot-major (bit-packed, bool) and the copy of its result to the host."""
    import jax
    import jax.numpy as jnp

    from stabilizer.frames import frames
    from stabilizer.frames import sampler as smp

    prog = sampler.program
    if sampler.engine == "native":  # the C engine: frames and outputs are one call
        return {"note": "stages are timed on the frame kernel's path (GPUs); this run took the C engine"}
    if sampler._tables is None:  # the CPU's flat program (program.flatten): its steps are one loop, not stages
        return {"note": "stages are timed on the frame kernel's path (GPUs); this run took the flat program"}
    tables = sampler._layouts[(False, False, True)]  # (detectors, observables); filled by the timed calls
    bits = [count for _, _, count in tables]  # each output's (padded index table, inversions, bits)
    budget = sampler._budget_words()
    words = smp.chunk_words(shots, budget)
    n = min(shots, 32 * words)
    key = jax.random.key(0)
    run = lambda: jax.block_until_ready(frames.run_program(sampler._structure, sampler._tables, key, prog.num_qubits,
                                                           prog.num_measurements, words, limits=sampler._limits))
    record = run()
    xor = lambda: jax.block_until_ready([smp.xor_rows(record, idx) for idx, _, _ in tables])
    rows = xor()

    def layout(packed: bool):
        return jax.jit(lambda rows: [smp.shot_major(smp.transpose_words(r), b, n, packed) for r, b in zip(rows, bits)])

    def transfer(arrays):  # a fresh device copy each time: an array caches its host copy
        times = []
        for _ in range(max(1, repeats)):
            fresh = jax.block_until_ready([jnp.copy(x) for x in arrays])
            t0 = time.perf_counter()
            [np.asarray(x) for x in fresh]
            times.append(time.perf_counter() - t0)
        return min(times)

    stages = {"chunk_shots": n, "chunks": -(-shots // (32 * budget))}
    stages["frames_s"] = _timed(run, repeats)[2]
    stages["xor_s"] = _timed(xor, repeats)[2]
    for packed, name in ((True, "packed"), (False, "bool")):
        fn = layout(packed)
        out, _, stages[f"transpose_{name}_s"], _ = _timed(lambda fn=fn: jax.block_until_ready(fn(rows)), repeats)
        stages[f"transfer_{name}_s"] = transfer(out)
        del out
    return stages


def custabilizer_surface(text: str, shots: int, repeats: int) -> dict:
    """NVIDIA cuStabilizer's frame simulator (cuquantum.stabilizer, Python API as documented for cuQuantum
    26.x): a fresh FrameSimulator per call (its tables start from zero frames), the circuit applied, the
    bit-packed measurement-flip record taken as a CuPy array (device) or copied to the host."""
    import inspect

    import cupy as cp
    import stim
    from cuquantum.stabilizer import Circuit, FrameSimulator

    c = stim.Circuit(text)
    t0 = time.perf_counter()
    circuit = Circuit(text)
    out = {"compile_s": time.perf_counter() - t0, "shots": shots,
           "version": getattr(__import__("cuquantum"), "__version__", None)}
    takes_detectors = "num_detectors" in inspect.signature(FrameSimulator).parameters  # cuQuantum 26.09 on
    extra = {"num_detectors": c.num_detectors} if takes_detectors else {}

    def record(to_host: bool):
        sim = FrameSimulator(c.num_qubits, shots, c.num_measurements, package="cupy", seed=1, **extra)
        sim.apply(circuit)
        bits = sim.get_measurement_bits(bit_packed=True)  # (measurements, shot bytes)
        if to_host:
            return cp.asnumpy(bits)
        cp.cuda.get_current_stream().synchronize()
        return bits

    for mode, to_host in (("device", False), ("packed_host", True)):
        result, first, best, times = _timed(lambda to_host=to_host: record(to_host), repeats)
        out |= {f"{mode}_s": best, f"{mode}_first_s": first, f"{mode}_times": times}
    flips = np.unpackbits(np.asarray(result)[:, :1250], axis=1, bitorder="little").T.astype(bool)[:min(shots, 10_000)]
    dets, obs = c.compile_m2d_converter().convert(measurements=flips ^ c.reference_sample(), separate_observables=True)
    return out | _rates(dets, obs) | {"rate_shots": len(flips)}


def worker(spec: dict) -> dict:
    tool, kind = spec["tool"], spec["workload"]
    if kind == "surface":
        return surface_worker(tool, spec)
    t0 = time.perf_counter()
    built = random_circuit(spec["n"], spec["depth"], spec["seed"], spec["measure_all"], text=not tool.startswith("ours"))
    build_s = time.perf_counter() - t0
    if tool.startswith("ours"):
        import jax
        import stabilizer as st

        circuit = built

        def run():  # with measurements, their outcomes to the host, as Stim's and QuaSARQ's runs end
            sim = st.TableauSimulator(seed=0, num_qubits=spec["n"])
            sim.do(circuit)
            jax.block_until_ready(sim._tableau)
            if spec["measure_all"]:
                sim.current_measurement_record()
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
            # quasarq.simulate only scans the circuit text; the simulation runs when a result is asked
            # for. Its run() then also copies the final tableau to the host and writes it out as 2n Pauli
            # strings, which the Python API cannot skip (so this time includes that host work).
            sim = quasarq.simulate(circuit)
            sim.measurements()
            return sim
    sim, first, best, times = _timed(run, spec["repeats"])
    out = {"build_s": build_s, "first_s": first, "seconds": best, "times": times}
    if tool == "quasarq":  # what earlier runs of this script timed (before 2026-11-26): the scan alone
        out["simulate_call_only_s"] = _timed(lambda: quasarq.simulate(circuit), spec["repeats"])[2]
    if spec["measure_all"]:  # every qubit measured once: a record of n bits, about half of them 1
        record = np.asarray(sim.measurements() if tool == "quasarq" else sim.current_measurement_record(), bool)
        out |= {"record_bits": int(record.size), "record_ones": int(record.sum())}
    return out


def run_isolated(spec: dict, timeout: float) -> dict:
    """Run `worker(spec)` in a subprocess; a crash or timeout becomes the record."""
    t0 = time.perf_counter()
    env = os.environ | ({"STABILIZER_KERNEL": "jax", "STABILIZER_NATIVE": "0"} if spec["tool"] == "ours-jax" else {})
    env |= {"STABILIZER_MEASURE": "slots"} if spec["tool"] == "ours-slots" else {}
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


def summary(r: dict) -> str:
    """One line per record: the times of each output mode (surface) or of the run (random)."""
    if r["workload"] == "surface":
        head = f"surface  d={r['d']:<3d} shots={r['shots']:<8d} {r['tool']:12s}"
        if r["status"] != "ok":
            return f"{head} {r['status']}"
        figs = [f"{mode} {r[mode + '_s'] * 1e3:.1f} ms" for mode in ("device", "packed_host", "bool_host")
                if mode + "_s" in r]
        stages = r.get("stages")
        if stages and "chunk_shots" in stages:
            figs.append(f"a chunk ({stages['chunk_shots']} shots, {stages['chunks']} in all): "
                        + " ".join(f"{k[:-2]} {v * 1e3:.1f}" for k, v in stages.items() if k.endswith("_s")))
        return f"{head} {', '.join(figs)}; rate {r['detector_rate']:.4f}"
    head = f"random   n={r['n']:<8d} {r['tool']:12s}"
    if r["status"] != "ok":
        return f"{head} {r['status']}"
    ones = f", record {r['record_ones']} ones of {r['record_bits']}" if "record_bits" in r else ""
    return f"{head} {r['seconds']:.3f} s (first {r['first_s']:.2f} s){ones}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--workloads", default="surface,random")
    ap.add_argument("--tools", default="ours,stim,quasarq,custabilizer")
    ap.add_argument("--distances", default="5,11,17,25")
    ap.add_argument("--p", type=float, default=1e-3)
    ap.add_argument("--shots", default="1e5,1e6", help="comma-separated shot counts (surface workload)")
    ap.add_argument("--qubits", default="1000,5000,20000,30000")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--measure-all", action="store_true")
    ap.add_argument("--modes", default="bool_host,packed_host,device,device_bool",
                    help="output modes timed (surface workload); rates come from bool_host, else packed_host")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.worker:
        try:
            result = worker(json.loads(args.worker))
        except ImportError as e:  # a peer that is not installed here
            result = {"status": f"unavailable ({e})"}
        print("RESULT " + json.dumps(result), flush=True)
        return
    import jax

    tools = args.tools.split(",")
    out = args.out or benchtools.default_out("stabilizer", jax.default_backend())
    meta = benchtools.environment(("stim", "quasarq", "cuquantum-python", "cuquantum-python-cu12",
                                   "cuquantum-python-cu13"))
    meta["args"] = vars(args) | {"out": str(out)}
    records = []

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"meta": meta, "records": records}, indent=1))

    specs = []
    if "surface" in args.workloads:
        for d in map(int, args.distances.split(",")):
            for shots in (int(float(x)) for x in args.shots.split(",")):
                specs += [{"tool": t, "workload": "surface", "d": d, "p": args.p, "shots": shots,
                           "repeats": args.repeats, "modes": args.modes.split(",")} for t in tools]
    if "random" in args.workloads:
        for n in map(int, args.qubits.split(",")):
            specs += [{"tool": t, "workload": "random", "n": n, "depth": args.depth, "seed": 0,
                       "measure_all": args.measure_all, "repeats": args.repeats}
                      for t in tools if t != "custabilizer"]  # a frame simulator: no tableau workload
    for spec in specs:
        r = run_isolated(spec, args.timeout)
        records.append(r)
        save()
        print(summary(r), flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
