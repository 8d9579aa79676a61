"""Exact state-vector gradients: adjoint differentiation against JAX's reverse mode, time and memory.

For a hardware-efficient ansatz (ry, rz layers, cz ladder) and the transverse-field Ising energy
at each --sizes n and --layers L: the jitted `pauliprop.statevector.adjoint.value_and_grad` and the
jitted `jax.value_and_grad` of `pauliprop.statevector.expectation` (reverse mode through the
scanned reference). For each: compile time, the median run time of --repeats runs after one, and
the compiled program's scratch memory (XLA's memory_analysis). A program that does not fit the
device is recorded as such. Results go to a JSON file.

    python experiments/statevector_gradient_bench.py --sizes 12,16 --layers 4,16     # CPU
    python experiments/statevector_gradient_bench.py --sizes 20,24 --layers 10,40    # a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import benchtools  # noqa: E402
import pauliprop as pp  # noqa: E402
from pauliprop import statevector as SV  # noqa: E402
from pauliprop.statevector.adjoint import value_and_grad  # noqa: E402


def measure(f, params, repeats):
    t0 = time.perf_counter()
    compiled = jax.jit(f).lower(params).compile()
    compile_s = time.perf_counter() - t0
    scratch = compiled.memory_analysis().temp_size_in_bytes
    jax.block_until_ready(compiled(params))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(params))
        runs.append(time.perf_counter() - t0)
    value, grad = compiled(params)
    return {"compile_s": compile_s, "run_s": statistics.median(runs), "scratch_bytes": int(scratch)}, value, grad


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="12,16")
    ap.add_argument("--layers", default="4,16")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    env = benchtools.environment(())
    print(f"# {env['device_kind']} ({env['jax_backend']})", flush=True)
    rows = []
    for n in [int(s) for s in args.sizes.split(",") if s]:
        h = pp.hamiltonians.tfim(n)
        for layers in [int(s) for s in args.layers.split(",") if s]:
            c = pp.ansatz.hardware_efficient(n, layers, rotations=("ry", "rz"), entangler="cz")
            params = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, c.num_params))
            row = {"qubits": n, "layers": layers, "gates": len(c.instructions), "params": c.num_params,
                   "state_bytes": 16 * 2**n}
            adjoint, va, ga = measure(lambda q: value_and_grad(c, h, q), params, args.repeats)
            row["adjoint"] = adjoint
            try:
                reverse, vr, gr = measure(jax.value_and_grad(lambda q: SV.expectation(c, h, q)), params, args.repeats)
                row["reverse"] = reverse
                row["max_grad_difference"] = float(jnp.max(jnp.abs(ga - gr)))
                row["value_difference"] = float(abs(va - vr))
            except Exception as e:  # out of device memory, typically
                row["reverse"] = {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}
            rows.append(row)
            rev = row["reverse"]
            rev_text = (f"reverse {rev['run_s'] * 1e3:9.1f} ms, scratch {rev['scratch_bytes'] / 2**20:9.1f} MiB"
                        if "run_s" in rev else f"reverse {rev['error'][:60]}")
            print(f"n={n:2d} layers={layers:3d} gates={row['gates']:5d}: adjoint {adjoint['run_s'] * 1e3:9.1f} ms, "
                  f"scratch {adjoint['scratch_bytes'] / 2**20:9.1f} MiB | {rev_text}", flush=True)
    result = {"environment": env, "git": benchtools.git_state(), "rows": rows}
    if args.note:
        result["note"] = args.note
    benchtools.write_result(result, args.out, "statevector_gradient_bench", env["jax_backend"])


if __name__ == "__main__":
    main()
