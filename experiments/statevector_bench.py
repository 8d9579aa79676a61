"""State-vector backend: the two seed papers' circuits, fused and unfused, against qiskit-aer.

Parts (every time is time.perf_counter around jax.block_until_ready, the median of --repeats runs
after a compile and a first run; amplitudes are complex128 unless --dtype says otherwise):
  floor   the memory-bandwidth floor: one element-wise pass over 2^n amplitudes (read and write,
          psi * c), jitted; GB/s = 2 * 2^n * itemsize / time. A fused pass is compared with it.
  passes  the cost model's input: one dense pass of width 1-7 and one diagonal pass
          (pauliprop.statevector.fusion.measure_pass_seconds) at the largest size.
  paper   the 2009 CUDA simulator's Table 9 circuits: Walsh (H on every qubit) and the QFT (Qiskit's
          synth_qft_full: H, controlled phases, final swaps; our import writes each controlled phase
          as rz, rz, rzz) at --sizes qubits.
  hyquas  HyQuas's seven benchmark circuits at --hyquas-qubits (bc, bv, hs, qaoa, qft, qv, sp),
          generated here (hyquas_circuits below: bv and qft exactly HyQuas's files, the others by
          their usual definitions; gate counts recorded per circuit).
  scaling weak scaling (--weak-scaling N): Walsh, the QFT and HyQuas's circuits (--weak-circuits) at
          N + G qubits sharded over 2^G devices (pauliprop.statevector.sharding, fuse="auto" within the
          local qubits) for every power of two up to the device count; efficiency = time on 1 device at
          N / time on 2^G devices at N + G; the all-to-alls counted in the lowered program and one timed
          alone (their share of the run).
For each circuit: ours jitted with fuse="auto" (k by the measured cost model) and each --widths k,
unfused (one pass per gate) up to --unfused-max qubits, with compile time, run time, number of
passes, and time per pass over the floor; qiskit-aer's AerSimulator(method="statevector") on the
host's CPU (its own fusion on, every core) up to --aer-max qubits, where amplitudes are also compared
(fidelity) up to --check-max qubits.

Examples
  python experiments/statevector_bench.py --sizes 12,16 --hyquas-qubits 14      # CPU smoke run
  XLA_FLAGS=--xla_force_host_platform_device_count=2 python experiments/statevector_bench.py \
      --sizes "" --weak-scaling 14                                              # sharded, CPU smoke run
  python experiments/statevector_bench.py --sizes 15,20,24,26,28,30 --hyquas-qubits 28   # a GPU
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import benchtools  # noqa: E402
import pauliprop as pp  # noqa: E402
from pauliprop.statevector import fusion  # noqa: E402
from pauliprop import statevector as SV  # noqa: E402


# ---- circuits (Qiskit QuantumCircuits: the same object goes to aer and, imported, to us) ----------

def walsh(n):
    from qiskit import QuantumCircuit

    qc = QuantumCircuit(n)
    qc.h(range(n))
    return qc


def qft(n):
    from qiskit.synthesis.qft import synth_qft_full

    return synth_qft_full(n)


def hyquas_circuits(n, seed=0):
    """HyQuas's seven benchmark families at n qubits. Its inputs (tests/input/*_28.qasm) are stored as
    Git LFS pointers we could not fetch; bv and qft are rebuilt exactly (their texts reproduce the
    pointers' SHA-256), the others follow the usual definitions, sized to the files' lengths."""
    from qiskit import QuantumCircuit, transpile
    from qiskit.circuit.library import quantum_volume

    rng = np.random.default_rng(seed)
    out = {}

    # bc: basis change (OpenFermion-style): a Givens-rotation network, a layer of rz, the inverse
    # network. A Givens rotation on modes (a, a+1) is exp(-i t (XX + YY) / 2) = rxx(t) ryy(t), plus rz.
    qc = QuantumCircuit(n)
    pairs = [(a, a + 1) for layer in range(n) for a in range(layer % 2, n - 1, 2)]
    angles = rng.uniform(0, 2 * math.pi, (len(pairs), 2))
    for (a, b), (t, phi) in zip(pairs, angles):
        qc.rxx(t, a, b)
        qc.ryy(t, a, b)
        qc.rz(phi, b)
    for q in range(n):
        qc.rz(rng.uniform(0, 2 * math.pi), q)
    for (a, b), (t, phi) in reversed(list(zip(pairs, angles))):
        qc.rz(-phi, b)
        qc.ryy(-t, a, b)
        qc.rxx(-t, a, b)
    out["bc"] = qc

    # bv (exact): secret all ones on qubits 0..n-2, qubit n-1 the oracle's target
    qc = QuantumCircuit(n)
    qc.h(range(n - 1))
    qc.x(n - 1)
    qc.h(n - 1)
    for q in range(n - 1):
        qc.cx(q, n - 1)
    qc.h(range(n - 1))
    out["bv"] = qc

    # hs: hidden shift over the bent function sum x_{2i} x_{2i+1}, a random shift
    shift = rng.integers(0, 2, n)
    qc = QuantumCircuit(n)
    qc.h(range(n))
    for q in np.flatnonzero(shift):
        qc.x(int(q))
    for q in range(0, n - 1, 2):
        qc.cz(q, q + 1)
    for q in np.flatnonzero(shift):
        qc.x(int(q))
    qc.h(range(n))
    for q in range(0, n - 1, 2):
        qc.cz(q, q + 1)
    qc.h(range(n))
    out["hs"] = qc

    # qaoa: p = 1 MaxCut on the complete graph (n(n-1)/2 rzz; the file's length fits cx-rz-cx per edge)
    gamma, beta = rng.uniform(0, math.pi, 2)
    qc = QuantumCircuit(n)
    qc.h(range(n))
    for a in range(n):
        for b in range(a + 1, n):
            qc.rzz(gamma, a, b)
    for q in range(n):
        qc.rx(2 * beta, q)
    out["qaoa"] = qc

    # qft (exact): H(i), then cp(pi / 2^(j-i)) on (i, j) for j > i; no final swaps
    qc = QuantumCircuit(n)
    for i in range(n):
        qc.h(i)
        for j in range(i + 1, n):
            qc.cp(math.pi / 2 ** (j - i), i, j)
    out["qft"] = qc

    # qv: quantum volume, 10 layers of random SU(4) blocks on random pairings, each as 3 cx and u3s
    out["qv"] = transpile(quantum_volume(n, depth=10, seed=seed), basis_gates=["u3", "cx"], optimization_level=1,
                          seed_transpiler=seed)

    # sp: Boixo et al.'s random circuits on a line: H on all, then 40 cycles of CZ on alternating
    # pairs, and on the other qubits a random one of sqrt(X), sqrt(Y), T
    qc = QuantumCircuit(n)
    qc.h(range(n))
    for cycle in range(40):
        busy = set()
        for q in range(cycle % 2, n - 1, 2):
            if rng.random() < 0.5:
                qc.cz(q, q + 1)
                busy |= {q, q + 1}
        for q in range(n):
            if q not in busy:
                [lambda q: qc.sx(q), lambda q: qc.ry(math.pi / 2, q), lambda q: qc.t(q)][rng.integers(3)](q)
    out["sp"] = qc
    return out


# ---- timing --------------------------------------------------------------------------------------

def timed(f, repeats):
    t0 = time.perf_counter()
    f().block_until_ready()
    first = time.perf_counter() - t0
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f().block_until_ready()
        runs.append(time.perf_counter() - t0)
    return first, statistics.median(runs)


def floor_seconds(n, dtype, repeats):
    psi = jnp.zeros(2**n, dtype)
    f = jax.jit(lambda x: x * jnp.asarray(1.0000001, dtype))
    f(psi).block_until_ready()
    return timed(lambda: f(psi), repeats)[1]


def run_ours(c, fuse, dtype, repeats):
    f = jax.jit(lambda: SV.simulate(c, dtype=dtype, fuse=fuse))
    t0 = time.perf_counter()
    compiled = f.lower().compile()
    compile_s = time.perf_counter() - t0
    first, run = timed(compiled, repeats)
    return compiled, {"compile_s": compile_s, "first_run_s": first, "run_s": run}


def run_aer(qc, dtype, threads, warmup="full"):
    from qiskit import QuantumCircuit
    from qiskit_aer import AerSimulator

    qc = qc.copy()
    qc.save_statevector()
    sim = AerSimulator(method="statevector", precision="single" if dtype == jnp.complex64 else "double",
                       max_parallel_threads=threads)
    if warmup == "full":
        sim.run(qc).result()  # warm-up: loads the library, first allocation of the state
    else:  # loads the library only; the timed run includes the first touch of the state's memory
        small = QuantumCircuit(2)
        small.h(0)
        small.save_statevector()
        sim.run(small).result()
    t0 = time.perf_counter()
    result = sim.run(qc).result()
    wall = time.perf_counter() - t0
    return np.asarray(result.get_statevector()), {"aer_wall_s": wall, "aer_time_taken_s": result.results[0].time_taken}


def bench_circuit(name, qc, args, dtype, floors, rows):
    n = qc.num_qubits
    c = pp.Circuit.from_qiskit(qc)
    counts = {}
    for ins in c.instructions:
        counts[ins.name] = counts.get(ins.name, 0) + 1
    row = {"circuit": name, "qubits": n, "dtype": jnp.dtype(dtype).name, "qiskit_gates": len(qc.data),
           "qiskit_counts": dict(qc.count_ops()), "gates": len(c.instructions), "gate_counts": counts, "ours": []}
    floor = floors[n]
    modes = ["auto"] + list(args.widths) + ([None] if n <= args.unfused_max else [])
    ours_psi = None
    for fuse in modes:
        steps = None
        if fuse == "auto":
            steps = fusion.choose_plan(c, dtype=dtype)
            k = steps.width
        elif fuse is not None:
            k, steps = fuse, fusion.plan(c, fuse)
        else:
            k = None
        passes = len(c.instructions) if steps is None else len(steps.blocks)
        compiled, t = run_ours(c, steps, dtype, args.repeats)
        t.update(fuse=fuse, width=k, passes=passes, per_pass_over_floor=t["run_s"] / passes / floor)
        if steps is not None:
            t["diagonal_passes"] = sum(b.diagonal for b in steps.blocks)
            t["elementwise_width"] = steps.elementwise_width
        row["ours"].append(t)
        print(f"  {name:5s} n={n:2d} fuse={str(fuse):4s} k={k} e={steps and steps.elementwise_width} passes={passes:4d} run {t['run_s'] * 1e3:9.2f} ms "
              f"({t['per_pass_over_floor']:.2f}x floor/pass) compile {t['compile_s']:.1f} s", flush=True)
        if fuse == "auto" and n <= args.check_max:
            ours_psi = np.asarray(compiled())
        del compiled
    if n <= args.aer_max:
        psi, t = run_aer(qc, dtype, args.aer_threads, args.aer_warmup)
        row["aer"] = t | {"warmup": args.aer_warmup}
        best = min(o["run_s"] for o in row["ours"])
        row["speedup_over_aer"] = t["aer_wall_s"] / best
        print(f"  {name:5s} n={n:2d} aer {t['aer_wall_s'] * 1e3:9.2f} ms  ours best {best * 1e3:.2f} ms: "
              f"{row['speedup_over_aer']:.1f}x", flush=True)
        if ours_psi is not None:
            row["fidelity_with_aer"] = float(abs(np.vdot(psi, ours_psi)) ** 2)
            print(f"  {name:5s} n={n:2d} fidelity with aer 1 - {1 - row['fidelity_with_aer']:.2e}", flush=True)
    rows.append(row)


def swap_seconds(local_qubits, devices, dtype, axis, repeats):
    """One swap of global qubit g0 with local axis `axis` (the all-to-all that sharding.py runs) on a
    block of 2^local_qubits amplitudes a device: its median time alone."""
    from jax.sharding import NamedSharding, PartitionSpec

    from pauliprop.statevector.sharding import qubit_mesh

    mesh = qubit_mesh(devices)
    spec = PartitionSpec(mesh.axis_names)
    shape = (len(devices),) + (2,) * local_qubits  # the leading axis: the device's block
    psi = jax.jit(lambda: jnp.ones(shape, dtype), out_shardings=NamedSharding(mesh, spec))()
    swap = jax.jit(jax.shard_map(lambda x: jax.lax.all_to_all(x, "g0", axis + 1, axis + 1, tiled=True),
                                 mesh=mesh, in_specs=spec, out_specs=spec, check_vma=False))
    return timed(lambda: swap(psi), repeats)[1]


def weak_scaling(base, dtype, repeats, names):
    """Rows of the weak-scaling part: each circuit at base + G qubits over 2^G devices, its all-to-alls
    counted in the lowered program, and one swap timed alone on the leading and on a middle local axis
    (all-to-all share = swaps x the leading-axis swap / run)."""
    from pauliprop.statevector.sharding import sharded_program, qubit_mesh

    devices = jax.devices()
    rows, swaps_alone = [], []
    for g in range(1, int(math.log2(len(devices))) + 1):  # base local qubits a device at every size
        for axis in (0, base // 2):
            t = swap_seconds(base, devices[:2**g], dtype, axis, repeats)
            swaps_alone.append({"devices": 2**g, "local_qubits": base, "axis": axis, "seconds": t})
            print(f"  swap alone on {2**g} devices, 2^{base} amplitudes each, local axis {axis}: {t * 1e3:.2f} ms",
                  flush=True)
    lead = {r["devices"]: r["seconds"] for r in swaps_alone if r["axis"] == 0}
    makers = {"walsh": walsh, "qft": qft}
    hyquas = functools.cache(hyquas_circuits)  # all seven at a size, built once
    for name in names:
        single = None
        for g in range(int(math.log2(len(devices))) + 1):
            n = base + g
            qc = makers[name](n) if name in makers else hyquas(n)[name.removeprefix("hyquas_")]
            c = pp.Circuit.from_qiskit(qc)
            program = sharded_program(c, dtype=dtype, fuse="auto", mesh=qubit_mesh(devices[:2**g]))
            params = jnp.zeros(0)
            t0 = time.perf_counter()
            lowered = program.lower(params)
            swaps = lowered.as_text().count("all_to_all")
            compiled = lowered.compile()
            compile_s = time.perf_counter() - t0
            first, run = timed(lambda: compiled(params), repeats)
            single = run if g == 0 else single
            row = {"circuit": name, "qubits": n, "devices": 2**g, "gates": len(c.instructions), "all_to_alls": swaps,
                   "compile_s": compile_s, "first_run_s": first, "run_s": run, "efficiency": single / run}
            if g:
                row["all_to_all_share"] = swaps * lead[2**g] / run
            rows.append(row)
            print(f"  {name:12s} n={n:2d} on {2**g} device(s): run {run * 1e3:9.2f} ms, efficiency "
                  f"{row['efficiency']:.2f}, {swaps} all-to-alls ({row.get('all_to_all_share', 0):.0%} of the run "
                  f"alone), compile {compile_s:.1f} s", flush=True)
            del compiled, lowered
    return rows, swaps_alone


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="15,18,20,22,24,26", help="qubit counts of Walsh and QFT")
    ap.add_argument("--hyquas-qubits", type=int, default=0, help="0: skip the HyQuas circuits")
    ap.add_argument("--hyquas", default="bc,bv,hs,qaoa,qft,qv,sp")
    ap.add_argument("--widths", default="", help="fixed fusion widths to time besides auto, e.g. 3,5")
    ap.add_argument("--dtype", default="complex128", choices=["complex64", "complex128"])
    ap.add_argument("--unfused-max", type=int, default=22, help="time unfused (a pass per gate) up to this size")
    ap.add_argument("--aer-max", type=int, default=28, help="run qiskit-aer up to this size (0: never)")
    ap.add_argument("--aer-threads", type=int, default=0, help="aer's threads (0: every core)")
    ap.add_argument("--aer-warmup", default="full", choices=["full", "small"],
                    help="aer's untimed first run: the circuit itself, or a 2-qubit one (for long 28-qubit runs)")
    ap.add_argument("--check-max", type=int, default=24, help="compare amplitudes with aer up to this size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--weak-scaling", type=int, default=0,
                    help="N: --weak-circuits at N + G qubits over 2^G devices (0: skip)")
    ap.add_argument("--weak-circuits", default="walsh,qft,hyquas_bc,hyquas_bv,hyquas_hs,hyquas_qaoa,hyquas_qft,"
                    "hyquas_qv,hyquas_sp", help="the weak-scaling part's circuits")
    ap.add_argument("--note", default="", help="recorded in the result file (e.g. the commit, where .git is stale)")
    args = ap.parse_args()
    args.widths = [int(w) for w in args.widths.split(",") if w]
    dtype = jnp.dtype(args.dtype).type
    sizes = [int(s) for s in args.sizes.split(",") if s]
    hyquas = [h for h in args.hyquas.split(",") if h] if args.hyquas_qubits else []

    env = benchtools.environment(("qiskit", "qiskit-aer"))
    print(f"# {env['device_kind']} ({env['jax_backend']}), {args.dtype}", flush=True)
    all_sizes = sorted(set(sizes) | ({args.hyquas_qubits} if hyquas else set())
                       | ({args.weak_scaling} if args.weak_scaling else set()))
    floors = {}
    for n in all_sizes:
        floors[n] = floor_seconds(n, dtype, args.repeats)
        gbs = 2 * 2**n * jnp.dtype(dtype).itemsize / floors[n] / 1e9
        print(f"floor n={n}: {floors[n] * 1e3:.3f} ms per pass ({gbs:.0f} GB/s)", flush=True)
    largest = max(all_sizes)
    # the cost model's passes at the largest size (a weak-scaling run alone skips them: its plans
    # measure their own, at min(n, 26) qubits)
    passes = fusion.measure_pass_seconds(largest, dtype=dtype, repeats=args.repeats) if sizes or hyquas else {}
    print(f"pass seconds at n={largest} (x floor): " + ", ".join(f"{k}: {v * 1e3:.2f} ms ({v / floors[largest]:.2f}x)"
                                                             for k, v in passes.items()), flush=True)

    rows = []
    for n in sizes:
        for name, make in (("walsh", walsh), ("qft", qft)):
            bench_circuit(name, make(n), args, dtype, floors, rows)
    if hyquas:
        circuits = hyquas_circuits(args.hyquas_qubits)
        for name in hyquas:
            bench_circuit(f"hyquas_{name}", circuits[name], args, dtype, floors, rows)

    scaling, swaps_alone = (weak_scaling(args.weak_scaling, dtype, args.repeats, args.weak_circuits.split(","))
                            if args.weak_scaling else ([], []))

    result = {"environment": env, "git": benchtools.git_state(), "dtype": args.dtype, "weak_scaling": scaling,
              "swap_alone": swaps_alone,
              "floor_s": {str(n): t for n, t in floors.items()},
              "floor_GBps": {str(n): 2 * 2**n * jnp.dtype(dtype).itemsize / t / 1e9 for n, t in floors.items()},
              "pass_seconds": {str(k): v for k, v in passes.items()}, "pass_seconds_qubits": largest, "rows": rows}
    if args.note:
        result["note"] = args.note
    benchtools.write_result(result, args.out, "statevector_bench", env["jax_backend"])


if __name__ == "__main__":
    main()
