"""A small circuit's first `pp.expectation` in a fresh process, as a new user meets it (issue 17).

Each case runs in its own subprocess, twice: first with an empty persistent compilation cache
(`PAULIPROP_CACHE_DIR` pointing at a new folder), then a second process on the cache the first one
filled. Recorded per process: the import of pauliprop, the first call (lowering, tracing, compiling,
running, the value copied to the host), a second call, and the programs the first call compiled or
took from the cache, with JAX's own times for tracing, lowering and compiling them (its compile log).

Cases: random circuits of RX/RZ with `Param` angles, H and CX (seeded), the TFIM Hamiltonian
(J = 1, h = 0.5) as the observable, untruncated or with min_abs_coeff 1e-4, and the exact state vector.

    python experiments/first_call.py --out experiments/results/first_call_cpu_DATE.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchtools import watch_compilations

sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = [  # (name, qubits, gates, method, truncated)
    ("4 qubits, 15 gates", 4, 15, "pauli", False),
    ("8 qubits, 40 gates", 8, 40, "pauli", False),
    ("8 qubits, 40 gates, min_abs_coeff 1e-4", 8, 40, "pauli", True),
    ("8 qubits, 40 gates, state vector", 8, 40, "statevector", False),
]


def worker(case: dict) -> dict:
    t0 = time.perf_counter()
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import pauliprop as pp

    out = {"import_s": time.perf_counter() - t0}
    compiles, hits, stages = watch_compilations()
    n, gates = case["qubits"], case["gates"]
    rng = np.random.default_rng(0)
    circuit, k = pp.Circuit(n), 0
    for _ in range(gates):
        q, r = int(rng.integers(n)), rng.random()
        if r < 0.3:
            circuit.rx(q, pp.Param(k))
            k += 1
        elif r < 0.5:
            circuit.rz(q, pp.Param(k))
            k += 1
        elif r < 0.6 or n == 1:
            circuit.h(q)
        else:
            a, b = rng.choice(n, 2, replace=False)
            circuit.cx(int(a), int(b))
    obs = pp.hamiltonians.tfim(n, 1.0, 0.5)
    params = rng.random(k)
    kw = {"method": case["method"]}
    if case["truncated"]:
        kw["truncation"] = pp.Truncation(min_abs_coeff=1e-4)
    compiles.clear(), hits.clear(), stages.update(trace=0.0, lower=0.0, compile=0.0)  # the call's own
    for name in ("first_call_s", "second_call_s"):
        t = time.perf_counter()
        value = float(pp.expectation(circuit, obs, params, **kw))
        out[name] = time.perf_counter() - t
        if name == "first_call_s":
            out |= {"programs": compiles[:], "compilations": len(compiles) - len(hits), "cache_hits": len(hits),
                    "stages_s": dict(stages)}
    out["value"] = value
    out["exact"] = float(pp.expectation(circuit, obs, params, method="statevector"))
    return out


def run(case: dict, cache: str) -> dict:
    env = dict(os.environ, PAULIPROP_CACHE_DIR=cache)
    env.pop("PAULIPROP_NO_CACHE", None)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(case)], env=env, capture_output=True,
                          text=True, timeout=600)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"status": f"failed (rc {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}", "process_s": wall}
    return json.loads(lines[-1][7:]) | {"status": "ok", "process_s": wall}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=5, help="fresh processes per case and cache state (default 5; "
                    "the summary line gives their median)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    import numpy as np

    import benchtools

    records = []
    for name, qubits, gates, method, truncated in CASES:
        case = {"name": name, "qubits": qubits, "gates": gates, "method": method, "truncated": truncated}
        runs = {"empty cache": [], "second process": []}
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:
                for process in runs:
                    r = case | {"process": process} | run(case, cache)
                    records.append(r)
                    runs[process].append(r)
        for process, rs in runs.items():
            ok = [r for r in rs if r["status"] == "ok"]
            if len(ok) < len(rs):
                print(f"{name:42s} {process:15s} {[r['status'] for r in rs if r['status'] != 'ok']}")
            if not ok:
                continue
            med = lambda f: float(np.median([f(r) for r in ok]))
            print(f"{name:42s} {process:15s} median of {len(ok)}: import {med(lambda r: r['import_s']):.2f} s, "
                  f"first call {med(lambda r: r['first_call_s']):.3f} s ({ok[0]['compilations']} compiled, "
                  f"{ok[0]['cache_hits']} from the cache; trace {med(lambda r: r['stages_s']['trace']):.2f}, lower "
                  f"{med(lambda r: r['stages_s']['lower']):.2f}, compile or load "
                  f"{med(lambda r: r['stages_s']['compile']):.2f}), later call "
                  f"{med(lambda r: r['second_call_s']) * 1e3:.1f} ms, |value - exact| <= "
                  f"{max(abs(r['value'] - r['exact']) for r in ok):.1e}", flush=True)
    result = {"meta": benchtools.environment(()) | {"git": benchtools.git_state()}, "records": records}
    benchtools.write_result(result, args.out, "first_call", result["meta"]["jax_backend"])


if __name__ == "__main__":
    main()
