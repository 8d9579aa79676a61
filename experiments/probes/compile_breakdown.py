"""What the kicked-Ising loop program costs to trace, lower and compile, part by part.

The loop's program for the 127-qubit kicked Ising (Z62, 20 steps) is traced, lowered and compiled on
this machine's backend with the unit kinds it holds code for cut down (Config.units: Clifford runs
only, rotations only) and with the SPLIT rooms and Clifford sweep width changed, so that each part's
share of the compilation shows; nothing runs. Each row also counts the compiled program's kernels
(fusions), sorts, gathers and scatters. The persistent compilation cache is off for this process.
Workloads: `ppjl` (min_abs_coeff 1e-4, max_weight 8, 2^16 slots: the 17-angle sweep's program) and
`pauli-prop` (max_terms 1e5 per gate, min_abs_coeff 1e-5, 2^17 slots: kicked_ising.py's program).

    python experiments/probes/compile_breakdown.py --out results/compile_breakdown_h100_DATE.json
    python experiments/probes/compile_breakdown.py --workload pauli-prop --out results/compile_breakdown_cpu_DATE.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ["PAULIPROP_NO_CACHE"] = "1"
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]  # probes/, experiments/

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

import benchtools  # noqa: E402
import pauliprop as pp  # noqa: E402
from pauliprop import models  # noqa: E402
from pauliprop.propagation import engine  # noqa: E402
from pauliprop.propagation import propagate as PR  # noqa: E402
from pauliprop.propagation import schedule as S  # noqa: E402

WORKLOADS = {"ppjl": (pp.Truncation(min_abs_coeff=1e-4, max_weight=8), 1 << 16),
             "pauli-prop": (pp.Truncation(max_terms=100_000, min_abs_coeff=1e-5), 1 << 17)}
ANGLES = 17


def measure(low, cfg, batch: bool, trunc) -> dict:
    """Trace, lower and compile the loop's program for cfg (a batch of ANGLES parameter sets or one)."""
    jax.clear_caches()
    PR._forward_jit.cache_clear()
    buf = PR._initial_buffer(models.single_z(62), cfg.capacity, np.float64)
    if batch:
        buf = jax.tree_util.tree_map(lambda a: np.broadcast_to(a, (ANGLES,) + a.shape), buf)
    params = PR.params_array(np.zeros((ANGLES, 1)) if batch else np.zeros(1), 1, np.float64)
    args = (low.tables, buf, np.int32(1), params, trunc.limits(np.float64), np.ones((128, 4)))
    fwd = PR._forward_jit(cfg, batch, jax.default_backend())
    t0 = time.perf_counter()
    traced = fwd.trace(*args)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    text = lowered.compile().as_text() or ""
    t3 = time.perf_counter()
    return dict(trace_s=t1 - t0, lower_s=t2 - t1, compile_s=t3 - t2, kernels=text.count("kind=k"),
                sorts=text.count(" sort("), gathers=text.count(" gather("), scatters=text.count(" scatter("),
                whiles=text.count(" while("), conditionals=text.count(" conditional("))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="ppjl")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    trunc, capacity = WORKLOADS[args.workload]
    low = PR.lowered(models.kicked_ising(20, pp.Param(0)), trunc, backend, layers=engine.layers_for(backend, trunc.rules))
    cfg = PR.config(low, trunc, capacity, True, backend, merged=True)
    rotation = S.U_LAYER if S.U_LAYER in cfg.units else S.U_SPLIT
    clifford, rotations = (S.U_CLIFFORD, S.U_NOOP), (S.U_NOOP, rotation)
    variants = {
        "whole program, batch of 17": (cfg, True),
        "whole program, one angle": (cfg, False),
        "Clifford runs only": (cfg._replace(units=clifford), True),
        "rotations only": (cfg._replace(units=rotations), True),
        "rotations only, one room (C)": (cfg._replace(units=rotations, rooms=(capacity,)), True),
        "rotations only, rooms C/16 and C": (cfg._replace(units=rotations, rooms=(capacity // 16, capacity)), True),
        "neither (the loop alone)": (cfg._replace(units=(S.U_NOOP,)), True),
    }
    rows = {}
    for name, (c, batch) in variants.items():
        rows[name] = measure(low, c, batch, trunc)
        print(name, {k: round(v, 3) if isinstance(v, float) else v for k, v in rows[name].items()}, flush=True)
    if cfg.sweep:
        sweep = engine.SWEEP
        try:
            engine.SWEEP = 1
            rows[f"Clifford runs only, one gate an iteration (not {sweep})"] = measure(
                low, cfg._replace(units=clifford), True, trunc)
        finally:
            engine.SWEEP = sweep
    result = {"benchmark": "compile_breakdown", "environment": benchtools.environment(()), "git": benchtools.git_state(),
              "workload": args.workload, "capacity": capacity,
              "config": {k: v for k, v in cfg._asdict().items() if k != "rules"}, "rows": rows}
    benchtools.write_result(result, args.out, "compile_breakdown", backend)


if __name__ == "__main__":
    main()
