"""P3's stress workload (Parallelizing Pauli Paths, arulrhikm/Parallelizing-Pauli-Paths, report.html):
random Pauli words on 7 qubits pushed through layers of Clifford gates, beside P3's published GPU
times (an RTX 2080).

P3 does not publish its layer generator; here a layer is H on all 7 qubits then CX(0,1), CX(2,3),
CX(4,5) (10 gates, so 500 layers are 5,000 gates, as P3's report counts them). The initial words are
uniform random 7-qubit words with random coefficients; duplicates merge (at most 4^7 = 16,384
distinct words exist). A Clifford-only circuit is one symplectic map in pauliprop (schedule.py), so
its cost is one pass over the words whatever the depth.

Per configuration: `first_s`, the first `pp.propagate` in this process (tracing, compilation where
the capacity is new, and the run), and `seconds`, the best of --repeats warm calls, each blocked
until the result is ready on the device. The whole script's process wall time is in `process_s`.
Each result is checked word for word (coefficients and signs) against the numpy reference map
(clifford.apply_map_numpy): `max_abs_error`.

    python experiments/p3_stress.py
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

import benchtools  # noqa: E402
import pauliprop as pp  # noqa: E402

IMPORT_S = time.perf_counter() - T0

# (initial words, layers, P3's published seconds on an RTX 2080)
CONFIGS = [(30000, 500, 0.129), (8000, 50, 0.009), (5000, 120, 0.021), (5000, 150, 0.026), (4000, 100, 0.017),
           (3000, 200, 0.034), (2000, 250, 0.043), (1000, 300, 0.052), (1000, 400, 0.069), (500, 500, 0.086)]
N = 7


def layered_circuit(layers: int) -> pp.Circuit:
    c = pp.Circuit(N)
    for _ in range(layers):
        for q in range(N):
            c.h(q)
        for q in range(0, N - 1, 2):
            c.cx(q, q + 1)
    return c


def random_words(count: int, seed: int) -> pp.PauliSum:
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 4**N, count)
    coeffs = rng.normal(size=count)
    merged: dict[int, float] = {}
    for code, c in zip(codes.tolist(), coeffs.tolist()):
        merged[code] = merged.get(code, 0.0) + c
    labels = {"".join("IXYZ"[(code >> (2 * q)) & 3] for q in range(N)): c for code, c in merged.items()}
    return pp.PauliSum.from_labels(labels)


def check(circuit: pp.Circuit, obs: pp.PauliSum, out: pp.PauliSum) -> float:
    """Largest coefficient mismatch between pauliprop's result and the numpy reference map."""
    from pauliprop.algebra import clifford
    from pauliprop.algebra import words as W
    from pauliprop.propagation import program, schedule

    sched = schedule.schedule(program.lower(circuit))
    m = clifford.CliffordMap(sched.map_x[0], sched.map_z[0], sched.map_phase[0])
    rx, rz, sign = clifford.apply_map_numpy(np.asarray(obs.x), np.asarray(obs.z), m)
    want = dict(zip(W.labels_of(rx, rz, N), sign * np.asarray(obs.coeffs)))
    coeffs = np.asarray(out.coeffs)
    got = {lab: c for lab, c in zip(W.labels_of(np.asarray(out.x), np.asarray(out.z), N), coeffs) if c != 0}
    if got.keys() != {k for k, v in want.items() if v != 0}:
        return float("inf")
    return max(abs(got[k] - want[k]) for k in got)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for words, layers, p3 in CONFIGS:
        circuit, obs = layered_circuit(layers), random_words(words, args.seed)
        t0 = time.perf_counter()
        out, stats = pp.propagate(circuit, obs)
        jax.block_until_ready(out.coeffs)
        first = time.perf_counter() - t0
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out, stats = pp.propagate(circuit, obs)
            jax.block_until_ready(out.coeffs)
            best = min(best, time.perf_counter() - t0)
        rows.append(dict(words=words, distinct_words=len(obs), layers=layers, gates=len(circuit.instructions),
                         first_s=first, seconds=best, p3_seconds=p3, speedup_vs_p3=p3 / best,
                         capacity=int(stats.capacity), max_abs_error=check(circuit, obs, out)))
        print(rows[-1], flush=True)
    result = {"benchmark": "p3_stress", "environment": benchtools.environment(()), "git": benchtools.git_state(),
              "import_s": IMPORT_S, "process_s": time.perf_counter() - T0, "rows": rows,
              "p3_source": "arulrhikm/Parallelizing-Pauli-Paths report.html, RTX 2080",
              "layer": "H on all 7 qubits, then CX(0,1) CX(2,3) CX(4,5)"}
    benchtools.write_result(result, args.out, "p3_stress", jax.default_backend())


if __name__ == "__main__":
    main()
