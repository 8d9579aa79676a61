"""A 5,000- and 10,000-qubit brickwork's first and warm `pp.expectation`, in fresh processes (issue 49).

The circuit is the kicked Ising model on a chain of n qubits, a brickwork: per step RX(theta_h) on every
qubit, then RZZ(theta_J) on the pairs (q, q + 1) of even q, then of odd q; theta_h = pi/4, theta_J = -pi/2
(the 127-qubit experiment's angles, DESIGN.md section 7); truncation min_abs_coeff 1e-4 and max_weight 8.
Observables (--cases):
  local          Z on qubit n/2 after --local-steps steps (5). Its backward light cone holds about 4 * steps
                 qubits (20 at 5 steps), and the engine runs only the gates inside it, on those qubits alone
                 (renumbered: words of one lane), so the call's cost beyond that cone is the front end's at n
                 qubits (lowering 1.5 n gates a step).
  magnetization  sum_q Z_q after --magnetization-steps steps (2): every gate acts on live words, n terms
                 at the start (coefficient 1 each, as min_abs_coeff is absolute); value / n is the mean.
Both are checked against the exact value (in a process of its own): the state vector of each term's light
cone (pp.expectation(..., method="statevector")); for the magnetization, the sites within 2 * steps + 2 of
either end one by one and two bulk sites, one of each parity, for the rest (the brickwork is invariant
under a shift by two sites). Each record says whether |estimate - exact| <= the dropped 1-norm.

Each (case, n) runs in two fresh processes: the first with an EMPTY cache (PAULIPROP_CACHE_DIR a new
folder: JAX's compiled programs; the native engine compiles nothing), the second on the cache the first
filled. Per process: the import, the build, the first call (lowering, compiling or loading, running),
the XLA programs it compiled or loaded (JAX's compile log), warm calls (the same call again: as many as
--repeats, within --timeout), peak and final terms, the dropped 1-norm, peak RSS, the engine (native on
CPUs, tiled on GPUs) and the load average around it (the machine may be shared).

    python experiments/large_n.py                        # CPU or GPU, whichever JAX sees; writes
                                                         # experiments/results/large_n_<backend>_<date>.json
    python experiments/large_n.py --qubits 5000 --cases local --repeats 2 --out /tmp/large_n.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchtools  # noqa: E402

THETA_H, THETA_J = math.pi / 4, -math.pi / 2
TRUNCATION = {"min_abs_coeff": 1e-4, "max_weight": 8}


def brickwork(pp, n: int, steps: int):
    """The kicked Ising chain: RX(theta_h) on every qubit, RZZ(theta_J) on even pairs, then odd pairs."""
    c = pp.Circuit(n)
    for _ in range(steps):
        for q in range(n):
            c.rx(q, THETA_H)
        for parity in (0, 1):
            for q in range(parity, n - 1, 2):
                c.rzz(q, q + 1, THETA_J)
    return c


def observable(pp, case: dict):
    n = case["qubits"]
    if case["observable"] == "local":
        return pp.PauliSum.from_list([("Z", [n // 2], 1.0)], n)
    return pp.PauliSum.from_list([("Z", [q], 1.0) for q in range(n)], n)


def light_cone(pp, circuit, site: int):
    """The gates in the backward light cone of `site`, on their qubits relabeled in increasing order, and
    the site's new label."""
    support, kept = {site}, []
    for ins in reversed(circuit.instructions):
        if support.intersection(ins.qubits):
            kept.append(ins)
            support.update(ins.qubits)
    where = {q: k for k, q in enumerate(sorted(support))}
    small = pp.Circuit(len(where))
    for ins in reversed(kept):
        small.append(ins.name, [where[q] for q in ins.qubits], *ins.args)
    return small, where[site]


def timed(f):
    t0, c0 = time.perf_counter(), time.process_time()
    out = f()
    return out, time.perf_counter() - t0, time.process_time() - c0


def worker_environment(case: dict) -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    return benchtools.environment(("qiskit",)) | {"command": case["command"]}


def worker_exact(case: dict) -> dict:
    """The exact value: <Z_q> from the state vector of Z_q's light cone, for q = n/2 (local) or summed over
    the sites (magnetization: the sites near the ends one by one, the bulk by its two parities)."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import pauliprop as pp

    n, steps = case["qubits"], case["steps"]
    circuit = brickwork(pp, n, steps)
    widest = []

    def z(q: int) -> float:
        small, site = light_cone(pp, circuit, q)
        widest.append(small.num_qubits)
        return float(pp.expectation(small, pp.PauliSum.from_list([("Z", [site], 1.0)], small.num_qubits),
                                    method="statevector"))

    def total() -> float:
        if case["observable"] == "local":
            return z(n // 2)
        margin = 2 * steps + 2
        ends = sorted(set(range(min(margin, n))) | set(range(max(0, n - margin), n)))
        bulk = [q for q in range(n) if margin <= q < n - margin]
        middle = n // 2 - n // 2 % 2
        by_parity = {0: z(middle), 1: z(middle + 1)} if bulk else {}
        return sum(z(q) for q in ends) + sum(by_parity[q % 2] for q in bulk)

    value, t, _ = timed(total)
    return {"exact": value, "light_cone_qubits": max(widest), "exact_s": t}


def worker_ours(case: dict) -> dict:
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import pauliprop as pp
    from pauliprop.propagation import propagate as prop

    rec = {"import_s": time.perf_counter() - t0, "backend": jax.default_backend(),
           "device": str(jax.devices()[0].device_kind), "cache_dir": os.environ.get("PAULIPROP_CACHE_DIR")}
    rec["engine"] = "native (C)" if prop.native_engine() is not None else "tiled (XLA)"
    compiles, hits, stages = benchtools.watch_compilations()
    (circuit, obs), t, _ = timed(lambda: (brickwork(pp, case["qubits"], case["steps"]), observable(pp, case)))
    rec |= {"build_s": t, "num_gates": len(circuit), "num_terms": len(obs)}
    truncation = pp.Truncation(**TRUNCATION)

    def call():
        value, stats = pp.expectation(circuit, obs, truncation=truncation, return_stats=True)
        return float(value), stats

    compiles.clear(), hits.clear(), stages.update(trace=0.0, lower=0.0, compile=0.0)  # the first call's own
    (value, stats), t, cpu = timed(call)
    rec |= {"first_call_s": t, "first_call_cpu_s": cpu, "value": value, "programs": compiles[:],
            "compilations": len(compiles) - len(hits), "cache_hits": len(hits), "stages_s": dict(stages),
            "peak_terms": int(stats.max_terms_seen), "final_terms": int(np.asarray(stats.terms)[0]),
            "capacity": int(stats.capacity), "overflow": bool(np.any(np.asarray(stats.overflow))),
            "dropped_norm": np.asarray(stats.dropped_norm).tolist()}
    jax.config.update("jax_log_compiles", False)
    warm, spent = [], 0.0
    while len(warm) < case["repeats"] and (not warm or spent + min(warm) <= case["timeout"]):
        (again, _), t, _ = timed(call)
        if again != value:
            raise SystemExit(f"a warm call gave {again}, the first {value}")
        warm.append(t)
        spent += t
    rec |= {"warm_calls_s": warm, "warm_call_s": min(warm), "peak_rss_mb": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss / 1024, "load_average_before_after": [load_before[0], os.getloadavg()[0]]}
    return rec


WORKERS = {"environment": worker_environment, "exact": worker_exact, "ours": worker_ours}


def run_child(kind: str, case: dict, env: dict, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, json.dumps(case)]
    record = benchtools.child_record(cmd, timeout, env, 3000, kind=kind)
    record.setdefault("status", "ok")
    return record


def fmt(v, digits=2):
    return "-" if v is None else f"{v:.{digits}f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--qubits", default="5000,10000", help="chain lengths (default 5000,10000)")
    ap.add_argument("--cases", default="local,magnetization", help="observables: local, magnetization")
    ap.add_argument("--local-steps", type=int, default=5)
    ap.add_argument("--magnetization-steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="warm calls per process at most (default 3)")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds for a process's first call, and again "
                    "for its warm calls (default 1200)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.worker:
        kind, case = args.worker
        print(json.dumps(WORKERS[kind](json.loads(case))), flush=True)
        return

    env = dict(os.environ)
    for var in ("PAULIPROP_NO_CACHE", "JAX_COMPILATION_CACHE_DIR", "NUMBA_CACHE_DIR"):
        env.pop(var, None)  # the processes' caches are the folders this script gives them, nothing else
    command = " ".join([Path(sys.argv[0]).name] + (sys.argv[1:] if argv is None else list(argv)))
    meta = run_child("environment", {"command": command}, dict(env, XLA_PYTHON_CLIENT_PREALLOCATE="false"), 300)
    meta.pop("process_s", None), meta.pop("status", None)
    meta |= {"git": benchtools.git_state(), "theta_h": THETA_H, "theta_j": THETA_J, "truncation": TRUNCATION,
             "repeats": args.repeats, "timeout_s": args.timeout}

    records, out = [], args.out
    for name in [c for c in args.cases.split(",") if c]:
        if name not in ("local", "magnetization"):
            ap.error(f"unknown case {name!r}: use local, magnetization")
        steps = args.local_steps if name == "local" else args.magnetization_steps
        for n in sorted(int(q) for q in args.qubits.split(",") if q):
            case = {"observable": name, "qubits": n, "steps": steps, "repeats": args.repeats, "timeout": args.timeout}
            exact = run_child("exact", case, env, args.timeout)
            with tempfile.TemporaryDirectory(prefix="pauliprop-cache-") as cache:
                for process in ("empty cache", "filled cache"):
                    r = case | {"process": process} | run_child("ours", case, dict(env, PAULIPROP_CACHE_DIR=cache),
                                                                2 * args.timeout + 120)
                    if "exact" in exact and "value" in r:
                        r |= exact | {"within_dropped_norm": abs(r["value"] - exact["exact"])
                                      <= sum(r["dropped_norm"]) + 1e-9 * max(1.0, abs(exact["exact"]))}
                    records.append(r)
                    print(f"{name:13s} n={n:6d} {process:12s} {r['status']:8s} import {fmt(r.get('import_s'))} s, "
                          f"build {fmt(r.get('build_s'))} s, first call {fmt(r.get('first_call_s'))} s "
                          f"({r.get('compilations')} compiled, {r.get('cache_hits')} from the cache), warm "
                          f"{fmt(r.get('warm_call_s'), 3)} s, value {r.get('value')}, peak terms {r.get('peak_terms')}, "
                          f"dropped {fmt(sum(r.get('dropped_norm', [])), 6)}, engine {r.get('engine')}"
                          + (f", exact {exact['exact']:.6f} (within the dropped norm: {r.get('within_dropped_norm')})"
                             if "exact" in exact else f", exact: {exact.get('status')}"), flush=True)
                    # after every record, so a run stopped from outside keeps what it measured
                    out = benchtools.write_result({"meta": meta, "records": records}, out, "large_n",
                                                  meta.get("jax_backend", "unknown"))
                    if r["status"] != "ok":
                        break


if __name__ == "__main__":
    main()
