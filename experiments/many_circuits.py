"""Many small circuits in one process, as a user loops over them: bounded compilation and memory.

Builds `--count` distinct random circuits (1-8 qubits, 5-40 gates, as OpenQASM 2 text parsed by
`Circuit.from_qasm`), estimates a random observable of each untruncated with `pp.expectation`, and
checks it against the state vector. Nothing clears JAX's caches. Records, every `--every`
circuits: the wall time, the resident memory, the memory maps of the process (vm.max_map_count
is 65,530 on many Linux machines: LLVM fails when compiled programs exhaust them) and the number
of XLA compilations so far. With bucketed tables both counts level off.

    python experiments/many_circuits.py --count 1000
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

import benchtools  # noqa: E402
import pauliprop as pp  # noqa: E402

ONE = ["h", "x", "s", "sdg", "t", "sx"]
TWO = ["cx", "cz", "swap"]
ROT1 = ["rx", "ry", "rz"]
ROT2 = ["rzz", "rxx"]


def random_qasm(rng: np.random.Generator) -> str:
    n = int(rng.integers(1, 9))
    lines = ["OPENQASM 2.0;", 'include "qelib1.inc";', f"qreg q[{n}];"]
    for _ in range(int(rng.integers(5, 41))):
        kind = rng.integers(4) if n > 1 else rng.integers(2)
        q = rng.choice(n, 2, replace=False) if n > 1 else [0, 0]
        angle = float(rng.choice([rng.uniform(-math.pi, math.pi), math.pi / 2, math.pi]))
        if kind == 0:
            lines.append(f"{rng.choice(ONE)} q[{q[0]}];")
        elif kind == 1:
            lines.append(f"{rng.choice(ROT1)}({angle!r}) q[{q[0]}];")
        elif kind == 2:
            lines.append(f"{rng.choice(TWO)} q[{q[0]}],q[{q[1]}];")
        else:
            lines.append(f"{rng.choice(ROT2)}({angle!r}) q[{q[0]}],q[{q[1]}];")
    return "\n".join(lines) + "\n"


def random_observable(rng: np.random.Generator, n: int) -> pp.PauliSum:
    labels = {"".join(rng.choice(list("IXYZ"), n)) for _ in range(int(rng.integers(1, 6)))}
    return pp.PauliSum.from_labels({lab: float(rng.normal()) for lab in sorted(labels)})


def process_memory() -> tuple[float, int]:
    """(resident MiB, number of memory maps) of this process (Linux; NaN and -1 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * 4096 / 2**20
        with open("/proc/self/maps") as f:
            maps = sum(1 for _ in f)
        return rss, maps
    except OSError:
        return float("nan"), -1


class CompileCounter:
    """Counts XLA compilations (JAX's backend_compile duration events)."""

    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, duration: float, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def run(count: int, seed: int = 0, every: int = 100, tolerance: float = 1e-9) -> dict:
    rng = np.random.default_rng(seed)
    compiles = CompileCounter()
    t0 = time.perf_counter()
    rows, worst = [], 0.0
    for i in range(1, count + 1):
        c = pp.Circuit.from_qasm(random_qasm(rng))
        h = random_observable(rng, c.num_qubits)
        val = float(pp.expectation(c, h))
        exact = float(pp.expectation(c, h, method="statevector"))
        err = abs(val - exact)
        worst = max(worst, err)
        if err > tolerance * max(1.0, abs(exact)):
            raise AssertionError(f"circuit {i}: pauli {val!r} != state vector {exact!r}")
        if i % every == 0 or i == count:
            rss, maps = process_memory()
            rows.append({"circuits": i, "seconds": round(time.perf_counter() - t0, 2), "rss_mib": round(rss, 1),
                         "memory_maps": maps, "compilations": compiles.count})
            print(rows[-1], flush=True)
    return {"rows": rows, "worst_abs_error": worst}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    result = {"benchmark": "many_circuits", "environment": benchtools.environment(("qiskit",)),
              "git": benchtools.git_state(), "count": args.count, "seed": args.seed,
              **run(args.count, args.seed, args.every)}
    benchtools.write_result(result, args.out, "many_circuits", jax.default_backend())


if __name__ == "__main__":
    main()
