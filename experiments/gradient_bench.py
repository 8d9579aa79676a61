"""Gradients of the Pauli-path estimator: value_and_grad against value, compile time, vmap throughput.

Parts (issue 3's benchmarks; every time is time.perf_counter around jax.block_until_ready):
  a  127-qubit kicked Ising (`pauliprop.models.kicked_ising_parametrized`: every RX and RZZ its own
     parameter, 5,420 at 20 steps), <Z62> at theta_h = pi/4, theta_j = -pi/2, truncation
     min_abs_coeff 1e-4 and max_weight 8. The capacity is expectation_fn's own (one propagation at
     these angles, times --headroom, as a power of two). Value: jax.jit of the objective; value_and_grad:
     the objective's compiled step (custom adjoint, pauliprop/propagation/adjoint.py). Each is traced, lowered
     and compiled explicitly (trace_s, compile_s), run once (first_run_s), then --repeats times
     (run_s: their median).
     Reverse mode (pauliprop/propagation/adjoint.py) records every unit's coefficient map in the
     forward pass when the records fit its budget (`reverse_mode`: "recorded", with records_bytes and
     record_budget_bytes) and sweeps back over them by gathers; the checkpointed fallback (segment
     starts kept, each segment replayed once) is timed beside it with the budget set to 0
     (`checkpointed_timing`). Goals (issue 47): value_and_grad <= 1.5x value on one H100, <= 2x on the
     2-core CPU at 8 steps; first call (compile included) <= 6 s on the H100.
  c  compile time of part a's value_and_grad at --steps and at twice that (same capacity): flat in
     depth because the units are a loop over data tables, not unrolled. Goal: < 10 s.
  b  PauliPropagation.jl's 64-qubit TFI gradient workload: 4 layers of RZZ on the open chain's 63
     bonds (even bonds, then odd) and RX on all 64 qubits, 508 parameters drawn N(0, 1) (seed 42;
     the Julia example draws randn with seed 42, a different stream), H = sum X_i + sum Z_i Z_{i+1},
     min_abs_coeff 1e-4 and max_weight 5, start |0>. Value and value_and_grad, each first call
     (trace, compile and first run: run with PAULIPROP_NO_CACHE=1 for an empty cache) and warm, and
     the gradient/value ratio, beside PauliPropagation.jl's published figures (quoted, not re-run:
     Julia is not installed here): loss 0.027 s, ForwardDiff gradient 2.08 s, first rewindgradient
     call 3.23 s. Goals (issue 47, 2-core CPU): ratio <= 2, first value_and_grad <= 3.23 s, warm
     <= 0.05 s.
  d  vmap throughput: value_and_grad of part b's circuit at 20 qubits for 256 parameter sets, one
     jax.jit(jax.vmap(...)) call against a Python loop of the compiled single step.

Examples
  python experiments/gradient_bench.py                      # all parts (CPU: about 3 minutes)
  python experiments/gradient_bench.py --parts b,d --repeats 5
  PAULIPROP_NO_CACHE=1 python experiments/gradient_bench.py --parts b,a --steps 8   # issue 47's CPU goals
  python experiments/gradient_bench.py --compare results/a.grads.npz results/b.grads.npz  # two devices' gradients
"""

from __future__ import annotations

import argparse
import json
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
from pauliprop import models  # noqa: E402
from pauliprop.propagation import adjoint  # noqa: E402

OPTIONS = pp.CPU_COMPILER_OPTIONS if jax.default_backend() == "cpu" else None
# PauliPropagation.jl's published figures for part b's workload (64 qubits, 4 layers, 508 params): the loss,
# the ForwardDiff gradient (DESIGN.md section 7) and the first call of its reverse mode, rewindgradient
PUBLISHED_PPJL = {"loss_s": 0.027, "forwarddiff_gradient_s": 2.08, "rewindgradient_first_call_s": 3.23}


def _timed(fn, *args):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    return out, time.perf_counter() - t0


COMPILES = 3  # compilations timed a program (--compiles): one on a machine shared with others is noisy


def measure(fn, args, repeats: int) -> dict:
    """Trace+lower, compile and run times of jax.jit(fn) (already jitted fns are accepted). compile_s: the
    median of COMPILES compilations, each of a new lowering after jax.clear_caches() (with
    PAULIPROP_NO_CACHE=1 none is read from a cache), all of them in compiles_s."""
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn, compiler_options=OPTIONS)
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    compiles = [time.perf_counter() - t1]
    for _ in range(COMPILES - 1):
        jax.clear_caches()  # else the new lowering finds its executable in memory
        again = jitted.lower(*args)
        t = time.perf_counter()
        again.compile()
        compiles.append(time.perf_counter() - t)
    # the first run also maps its buffers (gigabytes of records on a CPU: 2-3x a later run)
    out, first = _timed(compiled, *args)
    runs = []
    for _ in range(repeats):
        out, s = _timed(compiled, *args)
        runs.append(s)
    return {"trace_lower_s": t1 - t0, "compile_s": statistics.median(compiles), "compiles_s": compiles,
            "first_run_s": first, "run_s": statistics.median(runs), "runs_s": runs, "out": out}


def kicked_ising_case(steps: int):
    c = models.kicked_ising_parametrized(steps)
    angles = np.tile(np.r_[np.full(127, math.pi / 4), np.full(144, -math.pi / 2)], steps)
    return c, models.single_z(62), angles, pp.Truncation(min_abs_coeff=1e-4, max_weight=8)


def part_a(steps: int, repeats: int, headroom: float) -> dict:
    c, obs, angles, trunc = kicked_ising_case(steps)
    t0 = time.perf_counter()
    f = pp.expectation_fn(c, obs, angles, truncation=trunc, headroom=headroom)
    probe_s = time.perf_counter() - t0
    p = jnp.asarray(angles)
    value = measure(f, (p,), repeats)
    vg = measure(f.value_and_grad, (p,), repeats)
    v, g = vg.pop("out")
    v_only = value.pop("out")
    memory = reverse_mode(c, obs, trunc, f.capacity)
    # the fallback: segment starts kept, each segment replayed once (the budget is read at trace time)
    adjoint.RECORD_BUDGET = 0
    jax.clear_caches()
    try:
        checkpointed = measure(jax.jit(jax.value_and_grad(f), compiler_options=OPTIONS), (p,), repeats)
    finally:
        adjoint.RECORD_BUDGET = None
        jax.clear_caches()
    g_checkpointed = checkpointed.pop("out")[1]
    _, stats = pp.propagate(c, obs, angles, trunc, capacity=f.capacity)
    return {"qubits": 127, "steps": steps, "params": c.num_params, "gates": len(c.instructions),
            "capacity": f.capacity, "peak_terms": int(stats.max_terms_seen), "probe_s": probe_s,
            "value": float(v_only), "value_from_vg": float(v), "grad_norm": float(jnp.linalg.norm(g)),
            **memory, "value_timing": value, "value_and_grad_timing": vg, "ratio": vg["run_s"] / value["run_s"],
            "value_first_call_s": first_call(value), "first_call_s": first_call(vg),
            "compile_ratio": vg["compile_s"] / value["compile_s"], "checkpointed_timing": checkpointed,
            "checkpointed_ratio": checkpointed["run_s"] / value["run_s"],
            "checkpointed_max_grad_diff": float(jnp.abs(g_checkpointed - g).max()),
            "goal_ratio": 1.5 if jax.default_backend() == "gpu" else 2.0, "grad": np.asarray(g)}


def first_call(timing: dict) -> float:
    """A fresh program's first call: trace and lower, compile, first run."""
    return timing["trace_lower_s"] + timing["compile_s"] + timing["first_run_s"]


def reverse_mode(c, obs, trunc, capacity: int) -> dict:
    """Which reverse mode value_and_grad takes (adjoint.value_and_grad's rule), with its bytes."""
    from pauliprop.propagation.propagate import gradient_records

    rows, need = gradient_records(c, obs, trunc, capacity)
    budget = adjoint.record_budget()
    return {"reverse_mode": "recorded" if need <= budget else "checkpointed", "record_units": rows.units,
            "record_rows": rows.full, "records_bytes": int(need), "record_budget_bytes": int(budget)}


def part_c(steps: int, capacity: int) -> dict:
    """Compile times of value_and_grad at steps and 2 * steps."""
    out = {}
    for s in (steps, 2 * steps):
        c, obs, angles, trunc = kicked_ising_case(s)
        f = pp.expectation_fn(c, obs, angles, truncation=trunc, capacity=capacity)
        p = jnp.asarray(angles)
        t0 = time.perf_counter()
        lowered = jax.jit(jax.value_and_grad(f), compiler_options=OPTIONS).lower(p)
        t1 = time.perf_counter()
        lowered.compile()
        out[f"{reverse_mode(c, obs, trunc, capacity)['reverse_mode']}, {s} steps"] = {"gates": len(c.instructions), "trace_lower_s": t1 - t0,
                                           "compile_s": time.perf_counter() - t1}
    return {"capacity": capacity, "by_mode_and_steps": out, "goal_compile_s": 10.0}


def tfi_case(n: int, layers: int = 4, seed: int = 42):
    c = pp.Circuit(n)
    k = 0
    bonds = [(i, i + 1) for i in range(0, n - 1, 2)] + [(i, i + 1) for i in range(1, n - 1, 2)]
    for _ in range(layers):
        for a, b in bonds:
            c.rzz(a, b, pp.Param(k))
            k += 1
        for q in range(n):
            c.rx(q, pp.Param(k))
            k += 1
    h = pp.PauliSum.from_list([("X", [q], 1.0) for q in range(n)] + [("ZZ", [q, q + 1], 1.0) for q in range(n - 1)], n)
    return c, h, np.random.default_rng(seed).normal(size=c.num_params), pp.Truncation(min_abs_coeff=1e-4, max_weight=5)


def part_b(repeats: int) -> dict:
    c, h, thetas, trunc = tfi_case(64)
    t0 = time.perf_counter()
    f = pp.expectation_fn(c, h, thetas, truncation=trunc)
    probe_s = time.perf_counter() - t0
    p = jnp.asarray(thetas)
    value = measure(f, (p,), repeats)
    vg = measure(f.value_and_grad, (p,), repeats)
    v, g = vg.pop("out")
    value.pop("out")
    _, stats = pp.propagate(c, h, thetas, trunc, capacity=f.capacity)
    ppjl = PUBLISHED_PPJL
    return {"qubits": 64, "layers": 4, "params": c.num_params, "capacity": f.capacity,
            "peak_terms": int(stats.max_terms_seen), "probe_s": probe_s, "value": float(v),
            "grad_norm": float(jnp.linalg.norm(g)), **reverse_mode(c, h, trunc, f.capacity),
            "value_timing": value, "value_and_grad_timing": vg,
            "value_first_call_s": first_call(value), "first_call_s": first_call(vg),
            "ratio": vg["run_s"] / value["run_s"], "first_call_ratio": first_call(vg) / first_call(value),
            "compile_ratio": vg["compile_s"] / value["compile_s"],
            "peer": {"tool": "PauliPropagation.jl", **ppjl,
                     "forwarddiff_ratio": ppjl["forwarddiff_gradient_s"] / ppjl["loss_s"],
                     "source": "published figures (issue 47, DESIGN.md section 7), not re-run here"},
            "goals": {"ratio": 2.0, "first_call_s": ppjl["rewindgradient_first_call_s"], "warm_s": 0.05},
            "grad": np.asarray(g)}


def part_d(batch: int, n: int) -> dict:
    c, h, _, trunc = tfi_case(n)
    sets = np.random.default_rng(7).normal(size=(batch, c.num_params))
    f = pp.expectation_fn(c, h, sets[0], truncation=trunc, headroom=4)
    ps = jnp.asarray(sets)
    batched = jax.jit(jax.vmap(jax.value_and_grad(f)), compiler_options=OPTIONS)
    (vals, grads), first_batched = _timed(batched, ps)
    (vals, grads), batched_s = _timed(batched, ps)
    one = f.value_and_grad
    _, first_one = _timed(one, ps[0])
    t0 = time.perf_counter()
    loop = [one(ps[k]) for k in range(batch)]
    jax.block_until_ready(loop)
    loop_s = time.perf_counter() - t0
    worst = max(abs(float(loop[k][0]) - float(vals[k])) for k in range(batch))
    worst_g = max(float(jnp.abs(loop[k][1] - grads[k]).max()) for k in range(batch))
    return {"qubits": n, "params": c.num_params, "batch": batch, "capacity": f.capacity,
            "vmap_first_call_s": first_batched, "vmap_s": batched_s, "loop_first_call_s": first_one, "loop_s": loop_s,
            "vmap_sets_per_s": batch / batched_s, "loop_sets_per_s": batch / loop_s,
            "max_value_diff": worst, "max_grad_diff": worst_g}


def main(argv=None):
    global COMPILES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--parts", default="a,c,b,d", help="comma list of a, b, c, d (default: all)")
    ap.add_argument("--steps", type=int, default=20, help="kicked Ising steps of parts a and c (20)")
    ap.add_argument("--headroom", type=float, default=1.2, help="parts a and c: capacity = the peak at these "
                    "angles times this, as a power of two (1.2: 65,536 slots for a peak of 53,130)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs after compiling (median reported)")
    ap.add_argument("--compiles", type=int, default=COMPILES, help="compilations timed a program (median reported)")
    ap.add_argument("--batch", type=int, default=256, help="part d: parameter sets (256)")
    ap.add_argument("--batch-qubits", type=int, default=20, help="part d: qubits of the TFI circuit (20)")
    ap.add_argument("--compare", nargs=2, type=Path, default=None, metavar=("A", "B"),
                    help="print the largest difference between the gradients of two runs' .grads.npz and exit")
    ap.add_argument("--out", type=Path, default=None, help="JSON output (default experiments/results/"
                    "gradient_bench_<backend>_<date>.json)")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (np.load(f) for f in args.compare)
        for key in sorted(set(a.files) & set(b.files)):
            print(f"{key}: {a[key].size} parameters, max |difference| {np.abs(a[key] - b[key]).max():.2e}")
        return
    parts = [s.strip() for s in args.parts.split(",") if s.strip()]
    COMPILES = max(1, args.compiles)
    for s in parts:
        if s not in "abcd" or len(s) != 1:
            ap.error(f"unknown part {s!r}: use a, b, c, d")
    result = {"environment": benchtools.environment(()), "git": benchtools.git_state(), "parts": {}}
    out = args.out or benchtools.default_out("gradient_bench", jax.default_backend())

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=lambda x: np.asarray(x).tolist()))

    grads = {}  # parts a and b: the gradients, beside the JSON (<out>.grads.npz), to compare devices to 1e-10
    capacity = None
    for part in parts:
        t0 = time.perf_counter()
        if part == "a":
            r = part_a(args.steps, args.repeats, args.headroom)
            capacity = r["capacity"]
            print(f"a: value {r['value']:.7f}, capacity {r['capacity']}, value {r['value_timing']['run_s']:.3f} s, "
                  f"value_and_grad ({r['reverse_mode']}) {r['value_and_grad_timing']['run_s']:.3f} s, ratio "
                  f"{r['ratio']:.2f} (compile {r['value_timing']['compile_s']:.1f} / "
                  f"{r['value_and_grad_timing']['compile_s']:.1f} s, first call {r['first_call_s']:.1f} s); "
                  f"checkpointed {r['checkpointed_timing']['run_s']:.3f} s, ratio {r['checkpointed_ratio']:.2f}")
        elif part == "c":
            if capacity is None:
                c, obs, angles, trunc = kicked_ising_case(args.steps)
                capacity = pp.expectation_fn(c, obs, angles, truncation=trunc, headroom=args.headroom).capacity
            r = part_c(args.steps, capacity)
            print("c: " + "; ".join(f"{k}: trace+lower {v['trace_lower_s']:.1f} s, compile {v['compile_s']:.1f} s"
                                    for k, v in r["by_mode_and_steps"].items()))
        elif part == "b":
            r = part_b(args.repeats)
            vt, gt, peer = r["value_timing"], r["value_and_grad_timing"], r["peer"]
            print(f"b: value {r['value']:.6f}, capacity {r['capacity']} ({r['reverse_mode']}); warm: value "
                  f"{vt['run_s']:.3f} s, value_and_grad {gt['run_s']:.3f} s, ratio {r['ratio']:.2f}; first call: "
                  f"value {r['value_first_call_s']:.1f} s, value_and_grad {r['first_call_s']:.1f} s (compile "
                  f"{vt['compile_s']:.1f} / {gt['compile_s']:.1f} s). PauliPropagation.jl (published): loss "
                  f"{peer['loss_s']} s, ForwardDiff {peer['forwarddiff_gradient_s']} s (ratio "
                  f"{peer['forwarddiff_ratio']:.0f}), first rewindgradient {peer['rewindgradient_first_call_s']} s")
        else:
            r = part_d(args.batch, args.batch_qubits)
            print(f"d: {r['batch']} sets: vmap {r['vmap_s']:.2f} s ({r['vmap_sets_per_s']:.0f}/s), loop "
                  f"{r['loop_s']:.2f} s ({r['loop_sets_per_s']:.0f}/s), max diff {r['max_grad_diff']:.1e}")
        r["wall_s"] = time.perf_counter() - t0
        if "grad" in r:
            grads[f"{part}_steps{args.steps}" if part == "a" else part] = r.pop("grad")
            np.savez(out.with_suffix(".grads.npz"), **grads)
        result["parts"][part] = r
        save()
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
