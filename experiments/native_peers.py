"""pauliprop beside the two native Pauli-propagation engines: paulistrings-rs (Rust) and monoprop (C++).

Every (tool, workload, parameter) runs in a fresh subprocess, so each tool's import, first call
and warm calls are measured as a new user meets them, and one tool's threads or memory never
touch another's. All three get the same gate list (built once here, `problem`), the same
observable and the same truncation, applied after every gate.

Workloads
  ki       IBM's 127-qubit kicked Ising (Kim et al., Nature 618, 500 (2023)): per step RX(theta_h)
           on qubits 0..126, then RZZ(-pi/2) on the 144 heavy-hex edges (in
           pauliprop.models.heavy_hex_127's order, passed from this process to each tool's),
           --ki-steps steps (20); <Z62> in |0...0>; drop |c| < 1e-4 and Pauli weight > 8 after
           every gate; theta_h = --angles (pi/4, pi/8, pi/16). Ours is
           pauliprop.models.kicked_ising(steps, theta_h, -pi/2), checked instruction by instruction
           against the gate list the peers get.
           Published values at pi/4: 0.2613 (NVIDIA cuPauliProp, same settings), 0.2645.
  ising2d  monoprop's own Pauli benchmark (Algorithmiq/monoprop,
           packages/bench-third-party/pauli_prop/model.py and settings.json), mirrored exactly:
           the 2D tilted-field Ising on an L x L grid, qubit (r, c) = r*L + c; one Trotter step
           is RZZ(dt*J) on model.grid_edges (row-major: for each qubit the edge to its right, then
           the edge below), then RZ(dt*hz) on every qubit, then RX(dt*hx) on every qubit, with
           Qiskit's angles (their step_circuit is a Qiskit circuit that monoprop converts with
           from_qiskit_circuit); J = 1.5, hx = hz = 1, dt = 0.05, --trotter-steps steps (21, as in
           their scaling sweep: steps 0..40 by 2, one Trotter step per point); observable Z Z on
           their central_bond (row L//2, columns L//2 - 1 and L//2; (20, 21) at 6x6); drop
           |c| < 1e-6 after every gate, no weight cap (monoprop: cutoff = num_qubits).
           L = --sizes; a tool that times out at one L is not run at larger L.
           For L^2 <= --exact-max-qubits (16) also the exact value from our state vector.

Conventions: RX(a) = exp(-i a X/2), RZ(a) = exp(-i a Z/2), RZZ(a) = exp(-i a ZZ/2) (Qiskit's).
  ours          c.rx(q, a), c.rz(q, a), c.rzz(p, q, a): the same convention.
  paulistrings  Circuit.rx(a, q), Circuit.rz(a, q), Circuit.pauli_rotation("ZZ", [p, q], a):
                exp(-i a P/2), the same convention; Heisenberg picture via
                observable.propagate_with_stats(circuit, policy, direction="heisenberg"), value
                evolved.expectation("z+").real; policy truncation.coeff(eps) [& truncation.weight(k)]
                (keeps |c| > eps and weight <= k, after every layer = every gate).
  monoprop      ExpGate applies exp(+i theta H), so each gate is
                ExpGate(PauliOperator({Pauli(P, qubits): -0.5})) driven by theta = a, exactly what
                monoprop.qiskit_conversion.from_qiskit_circuit writes; PauliPropagator(observable,
                [], cutoff=k or num_qubits, lower_atol=eps).propagate(circuit), value
                expectation_value(). Its truncation is not ours: lower_atol is applied to the sine
                branch when a rotation splits a term (|sin| |c| <= atol is never created), not to
                terms whose coefficients shrink later, and the weight cutoff spares "fully paired"
                words (in the Pauli basis: words of I and Z only, the ones that have an overlap with
                |0...0>), so it keeps more terms and its values differ at the truncation's level.
Threads: paulistrings uses rayon's global pool (RAYON_NUM_THREADS), monoprop reads
  monoprop_NUM_THREADS; both are set to len(os.sched_getaffinity(0)) (--threads to override).
  Ours runs on XLA's default thread pool (every core of the host) or on the GPU JAX sees.

Per run: import seconds (the tool's import; ours: jax, jax_enable_x64, pauliprop), build seconds
(circuit and observable), first-call seconds (the call after imports and build: ours
pp.expectation(circuit, observable, truncation=...) with no capacity, return_stats=True;
paulistrings propagate_with_stats + expectation; monoprop constructing the propagator +
propagate + expectation_value), warm-call seconds (the same call again in the same process;
the best of up to --repeats, as many as fit in --timeout), the CPU seconds of the first call
(busy cores = CPU / wall), peak RSS, the value, term counts: ours stats.max_terms_seen (largest
live count) and final terms; paulistrings stats.peak_terms (largest count after a gate's
truncation) and final_terms; monoprop reports no peak: size() after the call (final terms), and,
untimed, one more pass one Trotter step per propagate() call (as monoprop's own benchmark runs)
with size() after every step (`terms_after_step`, its max `peak_terms_after_steps`).
Ours additionally: the XLA programs the first call compiled or loaded (JAX's compile log, as in
first_call.py: "Finished XLA compilation" minus persistent-cache hits), run twice, each in a
fresh process: with an EMPTY persistent compilation cache (PAULIPROP_CACHE_DIR = a new temp
folder; pauliprop/runtime/compilation.py) and then with the cache that process filled; the
capacity its growth found, the 1-norm each rule dropped, and one warm call starting at that
capacity (`warm_known_capacity_s`: no growth re-runs).
Contention: each record has `other_processes_cores`, the CPU the rest of the host used while the
child ran (/proc/stat less the child's and this script's CPU), in cores; on a shared machine compare
only runs where it is near 0.
Timeouts: --timeout bounds the first call (measured from the moment the child starts it); warm
calls get as many repeats as fit in another --timeout.

Checks (in the result file, `checks`): ours vs paulistrings (same truncation semantics; expect
~1e-10), ours vs monoprop (its truncation differs), and for small ising2d our exact state vector
vs all three.

    python experiments/native_peers.py --smoke --out /tmp/native_peers_smoke.json
    python experiments/native_peers.py --workloads ki,ising2d --sizes 4,6 \\
        --out experiments/results/native_peers_cpu_DATE.json
    git archive HEAD pauliprop | tar -x -C /tmp/pp_head   # ours at a fixed commit
    python experiments/native_peers.py --ours-src /tmp/pp_head --workloads ki
    python experiments/native_peers.py --tools paulistrings,monoprop --workloads ising2d \\
        --sizes 4,6,8,10,12,14,16 --timeout 120
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchtools import watch_compilations

sys.path.insert(0, str(Path(__file__).resolve().parent))

TOOLS = ("ours", "paulistrings", "monoprop")
WORKLOADS = ("ki", "ising2d")
DISTRIBUTIONS = {"ours": "pauliprop", "paulistrings": "paulistrings-rs", "monoprop": "monoprop"}
THREAD_VARS = {"paulistrings": "RAYON_NUM_THREADS", "monoprop": "monoprop_NUM_THREADS"}
PAULI = {"rx": "X", "rz": "Z", "rzz": "ZZ"}  # gate -> generator P of exp(-i a P/2)

KI_QUBITS, KI_OBS_QUBIT, KI_THETA_J = 127, 62, -math.pi / 2
KI_TRUNCATION = {"min_abs_coeff": 1e-4, "max_weight": 8}
ISING = {"J": 1.5, "hx": 1.0, "hz": 1.0, "dt": 0.05}
ISING_TRUNCATION = {"min_abs_coeff": 1e-6, "max_weight": None}


# ---- the workloads: one gate list for every tool ------------------------------------------------------

def grid_edges(L: int) -> list[tuple[int, int]]:
    """monoprop's model.grid_edges(L, L): row-major, each qubit's right neighbour, then the one below."""
    edges = []
    for r in range(L):
        for c in range(L):
            i = r * L + c
            if c + 1 < L:
                edges.append((i, i + 1))
            if r + 1 < L:
                edges.append((i, i + L))
    return edges


def central_bond(L: int) -> tuple[int, int]:
    """monoprop's model.central_bond(L, L)."""
    i = (L // 2) * L + max(L // 2 - 1, 0)
    return i, i + 1


def problem(case: dict) -> dict:
    """num_qubits, one Trotter step's gates [(gate, qubits, angle)], the number of steps, the
    observable (letters, qubits) and the truncation of a case."""
    if case["workload"] == "ki":
        th = case["theta_h"]
        step = [("rx", (q,), th) for q in range(KI_QUBITS)] + [("rzz", tuple(e), KI_THETA_J) for e in case["edges"]]
        return dict(n=KI_QUBITS, step=step, steps=case["steps"], obs=("Z", (KI_OBS_QUBIT,)), trunc=KI_TRUNCATION)
    L, p = case["L"], ISING
    n = L * L
    step = ([("rzz", e, p["dt"] * p["J"]) for e in grid_edges(L)] + [("rz", (q,), p["dt"] * p["hz"]) for q in range(n)]
            + [("rx", (q,), p["dt"] * p["hx"]) for q in range(n)])
    return dict(n=n, step=step, steps=case["steps"], obs=("ZZ", central_bond(L)), trunc=ISING_TRUNCATION)


# ---- the child processes ---------------------------------------------------------------------------

def emit(tag: str, record: dict | None = None) -> None:
    print(tag + ("" if record is None else " " + json.dumps(record)), flush=True)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(call):
    c0, t0 = cpu_seconds(), time.perf_counter()
    out = call()
    return out, time.perf_counter() - t0, cpu_seconds() - c0


def warm_calls(rec: dict, call, budget: float, repeats: int) -> None:
    """The same call again, at most `repeats` times while the next one fits in `budget` seconds;
    re-emits the record after each (the parent keeps the last one if it must stop the child)."""
    rec["warm_calls_s"], spent = [], 0.0
    for _ in range(max(1, repeats)):
        last = rec["warm_calls_s"][-1] if rec["warm_calls_s"] else rec["first_call_s"]
        if rec["warm_calls_s"] and spent + last > budget:
            break
        (value, _), t, _ = timed(call)
        rec["warm_calls_s"].append(t)
        rec["warm_call_s"] = min(rec["warm_calls_s"])
        rec["warm_value"] = value
        spent += t
        emit("RESULT", rec)


def worker_ours(case: dict) -> None:
    t0 = time.perf_counter()
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import pauliprop as pp
    from pauliprop import models

    rec = {"import_s": time.perf_counter() - t0, "version": getattr(pp, "__version__", None),
           "jax_version": jax.__version__, "device": str(jax.devices()[0].device_kind),
           "backend": jax.default_backend(), "threads": f"XLA default ({os.cpu_count()} cores on the host)",
           "pauliprop_file": pp.__file__,
           "cache_dir": os.environ.get("PAULIPROP_CACHE_DIR")}
    from pauliprop.propagation import propagate as prop

    native = prop.native_engine()  # CPUs: the native engine (C loops built at install), else the tiled engine
    rec["engine"] = "native (C)" if native is not None else "tiled (XLA)"
    if native is not None:
        rec |= {"native_library": native._native.__file__,
                "threads": f"{native.threads()} from {native.THREAD_MIN} live words, else one (the native engine)"}
    compiles, hits, stages = watch_compilations()

    t0 = time.perf_counter()
    prob = problem(case)
    n = prob["n"]
    if case["workload"] == "ki":
        circuit = models.kicked_ising(prob["steps"], case["theta_h"], KI_THETA_J)
    else:
        circuit = pp.Circuit(n)
        for _ in range(prob["steps"]):
            for gate, qubits, angle in prob["step"]:
                getattr(circuit, gate)(*qubits, angle)
    mine = [(i.name, tuple(i.qubits), float(i.args[0])) for i in circuit.instructions]
    if mine != [(g, tuple(q), float(a)) for g, q, a in prob["step"]] * prob["steps"]:
        raise SystemExit("our circuit is not the gate list the peers get")
    letters, qubits = prob["obs"]
    observable = pp.PauliSum.from_list([(letters, list(qubits), 1.0)], n)
    trunc = pp.Truncation(**{k: v for k, v in prob["trunc"].items() if v is not None})
    rec |= {"build_s": time.perf_counter() - t0, "num_gates": len(circuit.instructions)}

    def call(**kw):
        value, stats = pp.expectation(circuit, observable, truncation=trunc, return_stats=True, **kw)
        return float(value), stats

    from pauliprop.runtime import background

    host_runs = []  # the native engine's runs in this thread (GPUs: answered on the host while the program compiles)
    drive_native = prop._drive_native
    prop._drive_native = lambda *a, **k: host_runs.append(drive_native(*a, **k)) or host_runs[-1]
    compiles.clear(), hits.clear(), stages.update(trace=0.0, lower=0.0, compile=0.0)  # the call's own
    emit("STARTED")
    (value, stats), t, cpu = timed(call)
    if rec["backend"] != "cpu":
        # answered on the host (a finished native run), by the GPU's run racing it, or by the GPU in the foreground
        rec["first_call_answered_by"] = ("host (native engine) while the GPU program compiled" if any(
            r is not None for r in host_runs) else "the GPU's run in the background, which outpaced the host's"
            if host_runs else "the GPU")
        t0 = time.perf_counter()
        background.wait()
        rec["gpu_program_ready_after_first_call_s"] = time.perf_counter() - t0
    prop._drive_native = drive_native
    rec |= {"first_call_s": t, "first_call_cpu_s": cpu, "value": value, "programs": compiles[:],
            "compilations": len(compiles) - len(hits), "cache_hits": len(hits), "stages_s": dict(stages),
            "peak_terms": int(stats.max_terms_seen), "final_terms": int(np.asarray(stats.terms)[0]),
            "capacity": int(stats.capacity), "overflow": bool(np.any(np.asarray(stats.overflow))),
            "dropped_norm": np.asarray(stats.dropped_norm).tolist(),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    emit("RESULT", rec)
    jax.config.update("jax_log_compiles", False)
    warm_calls(rec, call, case["timeout"], case["repeats"])
    if sum(rec["warm_calls_s"]) + rec["warm_call_s"] <= case["timeout"]:
        _, t, _ = timed(lambda: call(initial_capacity=rec["capacity"]))
        rec["warm_known_capacity_s"] = t
    rec["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    emit("RESULT", rec)


def worker_exact(case: dict) -> None:
    """Our state vector, untruncated: the exact value of a small case (untimed against the others)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import pauliprop as pp

    prob = problem(case)
    circuit = pp.Circuit(prob["n"])
    for _ in range(prob["steps"]):
        for gate, qubits, angle in prob["step"]:
            getattr(circuit, gate)(*qubits, angle)
    letters, qubits = prob["obs"]
    observable = pp.PauliSum.from_list([(letters, list(qubits), 1.0)], prob["n"])
    emit("STARTED")
    value, t, _ = timed(lambda: float(pp.expectation(circuit, observable, method="statevector")))
    emit("RESULT", {"value": value, "first_call_s": t, "version": getattr(pp, "__version__", None),
                    "device": str(jax.devices()[0].device_kind)})


def worker_paulistrings(case: dict) -> None:
    t0 = time.perf_counter()
    import paulistrings as ps

    rec = {"import_s": time.perf_counter() - t0, "version": ps.__version__,
           "threads": {THREAD_VARS["paulistrings"]: os.environ.get(THREAD_VARS["paulistrings"])}}
    t0 = time.perf_counter()
    prob = problem(case)
    n = prob["n"]
    circuit = ps.Circuit(n)
    for _ in range(prob["steps"]):
        for gate, qubits, angle in prob["step"]:
            if gate == "rzz":
                circuit.pauli_rotation("ZZ", list(qubits), angle)
            else:
                getattr(circuit, gate)(angle, qubits[0])
    letters, qubits = prob["obs"]
    label = ["I"] * n
    for letter, q in zip(letters, qubits):
        label[q] = letter
    observable = ps.PauliSum.from_strings({"".join(label): 1.0}, num_qubits=n)
    tr = prob["trunc"]
    policy = ps.truncation.coeff(tr["min_abs_coeff"])
    if tr["max_weight"] is not None:
        policy = policy & ps.truncation.weight(tr["max_weight"])
    rec |= {"build_s": time.perf_counter() - t0, "num_gates": len(circuit.gates)}

    def call():
        evolved, stats = observable.propagate_with_stats(circuit, policy, direction="heisenberg")
        return float(evolved.expectation("z+").real), stats

    emit("STARTED")
    (value, stats), t, cpu = timed(call)
    rec |= {"first_call_s": t, "first_call_cpu_s": cpu, "value": value, "peak_terms": int(stats.peak_terms),
            "final_terms": int(stats.final_terms), "layers": int(stats.layers),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    del stats
    emit("RESULT", rec)
    warm_calls(rec, call, case["timeout"], case["repeats"])
    rec["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    emit("RESULT", rec)


def worker_monoprop(case: dict) -> None:
    t0 = time.perf_counter()
    import monoprop as mp

    rec = {"import_s": time.perf_counter() - t0, "version": mp.__version__,
           "threads": {THREAD_VARS["monoprop"]: os.environ.get(THREAD_VARS["monoprop"]),
                       "monoprop_PARTITIONS": os.environ.get("monoprop_PARTITIONS")}}
    t0 = time.perf_counter()
    prob = problem(case)
    n = prob["n"]

    def circuit_of(steps):  # exp(+i theta H) with H = -P/2 and theta = a: RP(a) = exp(-i a P/2)
        gates, angles = [], []
        for _ in range(steps):
            for gate, qubits, angle in prob["step"]:
                gates.append(mp.ExpGate(mp.PauliOperator({mp.Pauli(PAULI[gate], qubits): -0.5}, num_qubits=n)))
                angles.append(angle)
        return mp.Circuit(gates=gates, parameters=angles, initial_state=[], system_size=n)

    circuit = circuit_of(prob["steps"])
    letters, qubits = prob["obs"]
    observable = mp.PauliOperator({mp.Pauli(letters, qubits): 1.0}, num_qubits=n)
    tr = prob["trunc"]
    cutoff = n if tr["max_weight"] is None else tr["max_weight"]
    rec |= {"build_s": time.perf_counter() - t0, "num_gates": len(circuit), "cutoff": cutoff,
            "lower_atol": tr["min_abs_coeff"]}

    def new_propagator():
        return mp.PauliPropagator(observable, [], cutoff=cutoff, lower_atol=tr["min_abs_coeff"])

    def call():
        prop = new_propagator()
        prop.propagate(circuit)
        return float(prop.expectation_value()), prop

    emit("STARTED")
    (value, prop), t, cpu = timed(call)
    rec |= {"first_call_s": t, "first_call_cpu_s": cpu, "value": value, "peak_terms": None,
            "final_terms": int(prop.size()), "operator_memory_mb": prop._simulator.operator_memory_bytes() / 2**20,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    del prop
    emit("RESULT", rec)
    warm_calls(rec, call, case["timeout"], case["repeats"])
    if sum(rec["warm_calls_s"]) + rec["warm_call_s"] <= case["timeout"]:  # untimed: terms after each step
        one_step, prop, sizes = circuit_of(1), new_propagator(), []
        for _ in range(prob["steps"]):
            prop.propagate(one_step)
            sizes.append(int(prop.size()))
        rec |= {"terms_after_step": sizes, "peak_terms_after_steps": max(sizes),
                "stepwise_value": float(prop.expectation_value())}
    rec["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    emit("RESULT", rec)


def worker_environment(case: dict) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    import benchtools

    env = benchtools.environment(("monoprop", "paulistrings-rs")) | {"command": case["command"]}

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    env["gpu"] = gpus[0].device_kind if gpus else None
    emit("RESULT", env)


WORKERS = {"ours": worker_ours, "exact": worker_exact, "paulistrings": worker_paulistrings,
           "monoprop": worker_monoprop, "environment": worker_environment}


# ---- the parent -------------------------------------------------------------------------------------

def host_busy_seconds() -> float:
    """CPU seconds every process on the host has used since boot (/proc/stat: all but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except OSError:
        return float("nan")
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_child(kind: str, case: dict, env: dict, start_limit: float, first_limit: float, rest_limit: float) -> dict:
    """Run one worker; stop it if it has not started its first call `start_limit` s after launch, if
    the first call runs past `first_limit` s, or if the warm calls run past `rest_limit` s more.
    The record is the last RESULT line it printed, with its status."""
    proc = subprocess.Popen([sys.executable, __file__, "--worker", kind, json.dumps(case)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err, marks = [], [], {}
    launched, busy0, child0, own0 = time.perf_counter(), host_busy_seconds(), children_cpu_seconds(), cpu_seconds()

    def pump(stream, sink):
        for line in stream:
            sink.append(line)
            if line.startswith("STARTED"):
                marks.setdefault("started", time.perf_counter())
            elif line.startswith("RESULT"):
                marks.setdefault("first", time.perf_counter())

    readers = [threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err), daemon=True)]
    for r in readers:
        r.start()
    status = None
    while proc.poll() is None:
        now = time.perf_counter()
        if "started" not in marks and now - launched > start_limit:
            status = "timed out before the first call (import or build)"
        elif "started" in marks and "first" not in marks and now - marks["started"] > first_limit:
            status = "timed out"
        elif "first" in marks and now - marks["first"] > rest_limit:
            status = "ok (warm calls cut by the timeout)"
        if status:
            proc.kill()
            break
        time.sleep(0.1)
    proc.wait()
    for r in readers:
        r.join(timeout=5)
    results = [line for line in out if line.startswith("RESULT ")]
    record = json.loads(results[-1][7:]) if results else {}
    if status is None:
        status = "ok" if proc.returncode == 0 and results else f"failed (rc {proc.returncode})"
    record["status"] = status
    if status.startswith("failed"):
        record["stderr"] = "".join(err)[-3000:]
    record["process_s"] = time.perf_counter() - launched
    # what the rest of the host ran meanwhile (another job on a shared machine slows every tool)
    other = (host_busy_seconds() - busy0) - (children_cpu_seconds() - child0) - (cpu_seconds() - own0)
    record["other_processes_cores"] = max(0.0, other) / record["process_s"]
    return record


def parse_angle(text: str) -> float:
    expr = re.sub(r"(\d)\s*pi", r"\1*pi", text.strip())
    if not re.fullmatch(r"[0-9.eE+\-*/() pi]+", expr):
        raise argparse.ArgumentTypeError(f"not an angle: {text!r}")
    return float(eval(expr, {"__builtins__": {}}, {"pi": math.pi}))


def fmt_s(x) -> str:
    return "-" if x is None else (f"{x:.3g}" if x < 100 else f"{x:.0f}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated: ours,paulistrings,monoprop")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: ki,ising2d")
    ap.add_argument("--angles", default="pi/4,pi/8,pi/16", help="kicked Ising theta_h values (pi/4 or 0.785)")
    ap.add_argument("--ki-steps", type=int, default=20)
    ap.add_argument("--sizes", default="4,6,8,10,12", help="2D Ising L values (L x L grid)")
    ap.add_argument("--trotter-steps", type=int, default=21)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for a first call (default 120); "
                    "the warm calls get as much again")
    ap.add_argument("--repeats", type=int, default=3, help="warm calls at most (the best is warm_call_s)")
    ap.add_argument("--threads", type=int, default=None, help="the peers' thread count (default: every core in "
                    "os.sched_getaffinity)")
    ap.add_argument("--exact-max-qubits", type=int, default=16, help="state-vector reference up to this many qubits")
    ap.add_argument("--ours-src", type=Path, help="a folder holding the pauliprop package to measure (put first "
                    "on PYTHONPATH in our processes), e.g. `git archive COMMIT pauliprop | tar -x -C DIR`: a "
                    "fixed commit while the working tree changes; default: the pauliprop Python imports")
    ap.add_argument("--smoke", action="store_true", help="tiny: KI 2 steps at pi/4, 2D Ising L=4 with 3 steps")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.worker:
        WORKERS[args.worker[0]](json.loads(args.worker[1]))
        return

    import benchtools

    tools = [t for t in args.tools.split(",") if t]
    workloads = [w for w in args.workloads.split(",") if w]
    for t in tools:
        if t not in TOOLS:
            ap.error(f"unknown tool {t!r}")
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    angles = [(a, parse_angle(a)) for a in args.angles.split(",") if a]
    sizes = sorted(int(s) for s in args.sizes.split(",") if s)
    ki_steps, trotter_steps = args.ki_steps, args.trotter_steps
    if args.smoke:
        angles, ki_steps, sizes, trotter_steps = angles[:1], 2, [4], 3
    threads = args.threads or len(os.sched_getaffinity(0))
    base_env = dict(os.environ)
    for var in ("PAULIPROP_NO_CACHE", "JAX_COMPILATION_CACHE_DIR"):
        base_env.pop(var, None)
    ours_env = dict(base_env)
    if args.ours_src:
        src = str(args.ours_src.resolve())
        if not (args.ours_src / "pauliprop" / "__init__.py").exists():
            ap.error(f"--ours-src {src} holds no pauliprop package")
        ours_env["PYTHONPATH"] = os.pathsep.join(p for p in (src, base_env.get("PYTHONPATH")) if p)

    command = " ".join([Path(sys.argv[0]).name] + (sys.argv[1:] if argv is None else list(argv)))
    meta = run_child("environment", {"command": command}, dict(ours_env, XLA_PYTHON_CLIENT_PREALLOCATE="false"),
                     300, 300, 300)
    meta.pop("process_s", None), meta.pop("status", None)
    meta |= {"git": benchtools.git_state(), "peer_threads": threads,
             "thread_settings": {"paulistrings": f"RAYON_NUM_THREADS={threads}",
                                 "monoprop": f"monoprop_NUM_THREADS={threads}",
                                 "ours": "CPUs: the native engine's PAULIPROP_NATIVE_THREADS (default: every core in "
                                         "the affinity mask; see each record's threads), XLA's default pool"},
             "timeout_s": args.timeout, "repeats": args.repeats,
             "ours_src": str(args.ours_src.resolve()) if args.ours_src else None}

    edges = []  # the heavy-hex graph, built here (the peers' processes import no JAX) and passed to every tool
    if "ki" in workloads:
        from pauliprop.models.kicked_ising_127 import heavy_hex_127

        edges = [list(e) for e in heavy_hex_127()]
    cases = []
    for w in workloads:
        if w == "ki":
            cases += [{"workload": "ki", "label": f"KI theta_h={name}", "theta_h": value, "theta_h_text": name,
                       "theta_j": KI_THETA_J, "steps": ki_steps, "num_qubits": KI_QUBITS, "edges": edges}
                      for name, value in angles]
        else:
            cases += [{"workload": "ising2d", "label": f"2D Ising L={L}", "L": L, "steps": trotter_steps,
                       "num_qubits": L * L, **ISING} for L in sizes]

    records, failed = [], set()  # failed: tools that timed out at a 2D Ising size, skipped at larger sizes
    for case in cases:
        case = case | {"truncation": problem(case)["trunc"], "timeout": args.timeout, "repeats": args.repeats}
        for tool in tools:
            ident = {"tool": tool, "workload": case["workload"], "case": case["label"],
                     "parameters": {k: v for k, v in case.items() if k not in ("label", "timeout", "repeats", "edges")}}
            if case["workload"] == "ising2d" and tool in failed:
                records.append(ident | {"status": "skipped (timed out at a smaller size)"})
                print(f"{case['label']:24s} {tool:13s} skipped", flush=True)
                continue
            runs = []
            if tool == "ours":
                with tempfile.TemporaryDirectory(prefix="pauliprop-cache-") as cache:
                    env = dict(ours_env, PAULIPROP_CACHE_DIR=cache)
                    for process in ("empty cache", "filled cache"):
                        r = run_child("ours", case, env, 300, args.timeout, args.timeout + 30)
                        runs.append(ident | {"process": process} | r)
                        if not r["status"].startswith("ok"):
                            break
            else:
                env = dict(base_env, **{THREAD_VARS[tool]: str(threads)})
                runs.append(ident | {"process": "fresh"} | run_child(tool, case, env, 300, args.timeout,
                                                                     args.timeout + 30))
            for r in runs:
                records.append(r)
                print(f"{case['label']:24s} {tool:13s} {r.get('process', ''):12s} {r['status']:10s} "
                      f"import {fmt_s(r.get('import_s'))} s, first {fmt_s(r.get('first_call_s'))} s, "
                      f"warm {fmt_s(r.get('warm_call_s'))} s, value {r.get('value')}, "
                      f"peak terms {r.get('peak_terms')}, final terms {r.get('final_terms')}"
                      + (f", {r['compilations']} compiled / {r['cache_hits']} from the cache"
                         if "compilations" in r else "")
                      + (f"; other processes used {r['other_processes_cores']:.2f} cores meanwhile"
                         if r.get("other_processes_cores", 0) > 0.2 else ""), flush=True)
            if not runs[0]["status"].startswith("ok"):
                failed.add(tool)
        if case["workload"] == "ising2d" and case["num_qubits"] <= args.exact_max_qubits:
            r = run_child("exact", case, ours_env, 300, 600, 60)
            records.append({"tool": "ours (state vector, exact)", "workload": case["workload"], "case": case["label"],
                            "parameters": {k: v for k, v in case.items() if k not in ("label", "timeout", "repeats")},
                            "process": "fresh"} | r)
            print(f"{case['label']:24s} exact value {r.get('value')} ({r['status']})", flush=True)

    checks = value_checks(records)
    result = {"meta": meta, "records": records, "checks": checks}
    out = args.out or benchtools.default_out("native_peers", "gpu" if meta.get("gpu") else "cpu")
    benchtools.write_result(result, out, "native_peers", "cpu")
    print_tables(records, checks)


def value_of(records, case, tool, process=None):
    for r in records:
        if r["case"] == case and r["tool"] == tool and (process is None or r.get("process") == process) \
                and r.get("value") is not None:
            return r["value"]
    return None


def value_checks(records) -> list[dict]:
    checks = []
    for case in dict.fromkeys(r["case"] for r in records):
        ours = value_of(records, case, "ours", "empty cache")
        vals = {"ours": ours, "ours (filled cache)": value_of(records, case, "ours", "filled cache"),
                "paulistrings": value_of(records, case, "paulistrings"),
                "monoprop": value_of(records, case, "monoprop"),
                "exact": value_of(records, case, "ours (state vector, exact)")}
        pairs = [("ours", "paulistrings"), ("ours", "monoprop"), ("paulistrings", "monoprop"),
                 ("ours", "ours (filled cache)"), ("ours", "exact"), ("paulistrings", "exact"), ("monoprop", "exact")]
        for a, b in pairs:
            if vals[a] is not None and vals[b] is not None:
                checks.append({"case": case, "a": a, "b": b, "value_a": vals[a], "value_b": vals[b],
                               "abs_diff": abs(vals[a] - vals[b])})
    return checks


def print_tables(records, checks) -> None:
    def rec(case, tool, process=None):
        for r in records:
            if r["case"] == case and r["tool"] == tool and (process is None or r.get("process") == process):
                return r
        return None

    def cell(r, *, cache=None):
        if r is None:
            return "-"
        if not r["status"].startswith("ok"):
            return r["status"]
        text = f"{fmt_s(r.get('first_call_s'))} / {fmt_s(r.get('warm_call_s'))}"
        if cache is not None and cache.get("first_call_s") is not None:
            text = (f"{fmt_s(r.get('first_call_s'))} ({fmt_s(cache['first_call_s'])} cached) "
                    f"/ {fmt_s(r.get('warm_call_s'))}")
        return text

    cases = list(dict.fromkeys(r["case"] for r in records))
    print("\nseconds, first call / warm call (ours: first with an empty compilation cache, (filled cache))")
    print("| workload | ours first/warm | paulistrings first/warm | monoprop first/warm |")
    print("|---|---|---|---|")
    for case in cases:
        print(f"| {case} | {cell(rec(case, 'ours', 'empty cache'), cache=rec(case, 'ours', 'filled cache'))} "
              f"| {cell(rec(case, 'paulistrings'))} | {cell(rec(case, 'monoprop'))} |")
    print("\nvalues (peak terms; monoprop: final terms)")
    print("| workload | ours | paulistrings | monoprop | exact | ours - paulistrings | ours - monoprop |")
    print("|---|---|---|---|---|---|---|")
    diff = {(c["case"], c["a"], c["b"]): c["abs_diff"] for c in checks}
    for case in cases:
        def v(tool, process=None, terms="peak_terms"):
            r = rec(case, tool, process)
            if r is None or r.get("value") is None:
                return "-"
            t = r.get(terms) if r.get(terms) is not None else r.get("final_terms")
            return f"{r['value']:.8f}" + (f" ({t})" if t is not None else "")
        d = lambda a, b: f"{diff[(case, a, b)]:.1e}" if (case, a, b) in diff else "-"
        print(f"| {case} | {v('ours', 'empty cache')} | {v('paulistrings')} | {v('monoprop')} "
              f"| {v('ours (state vector, exact)')} | {d('ours', 'paulistrings')} | {d('ours', 'monoprop')} |")


if __name__ == "__main__":
    main()
