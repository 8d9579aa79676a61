"""The sharded path on one device beside the unsharded one (issue 20, deliverable 2: within 1.2x).

Workload (experiments/terms_at_scale.py's): <Z62> of the 127-qubit kicked Ising after --steps steps
at theta_h = pi/4, keeping the largest --fill x capacity terms after every gate (max_terms) and
dropping |c| < --min-abs-coeff, at a fixed capacity of 2^--log2-capacity slots. Two variants:

  unsharded  pp.expectation(circuit, obs, truncation=..., capacity=C)
  sharded    pauliprop.sharded.expectation(..., capacity=C, mesh=a mesh of the first device)

Each variant runs in fresh processes (--rounds of them, the variants interleaved), and each process
times its first call (compilation included, JAX's persistent compilation cache off unless --cache:
`first_call_s`) and then --repeats warm calls (`warm_s`: each; the summary takes the best). A third
process a round runs both and takes their warm calls in turn (`alternating`: a load that drifts
between processes, as on a shared CPU, hits both alike; the summary lists its ratios). The values
must agree (the sharded path on one device applies the engine's own units). Results JSON to
--out, or $OUT/sharded_overhead_<backend>.json when $OUT is set, else experiments/results/.

    python experiments/sharded_overhead.py                        # GPU: 2^20 slots, 20 steps
    python experiments/sharded_overhead.py --log2-capacity 12 --steps 4 --rounds 1   # quick CPU check
    python experiments/sharded_overhead.py --devices 2   # the sharded variant over two GPUs (a mesh of 2)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REPO_ROOT = HERE.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

VARIANTS = ("unsharded", "sharded")  # each alone in fresh processes; "alternating": both in one process


def child(variant: str, log2: int, fill: float, min_abs_coeff: float, steps: int, repeats: int,
          devices: int = 1) -> dict:
    t_start = time.perf_counter()
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import pauliprop as pp
    from pauliprop import models
    from pauliprop.propagation import sharded

    capacity = 1 << log2
    trunc = pp.Truncation(max_terms=int(fill * capacity), min_abs_coeff=min_abs_coeff)
    circuit, obs = models.kicked_ising(steps, math.pi / 4), models.single_z(62)
    mesh = sharded.default_mesh(jax.devices()[:devices])
    calls = dict(unsharded=lambda: pp.expectation(circuit, obs, truncation=trunc, capacity=capacity, return_stats=True),
                 sharded=lambda: sharded.expectation(circuit, obs, truncation=trunc, capacity=capacity, mesh=mesh,
                                                     return_stats=True))
    if variant == "alternating":  # both in one process, warm calls taken in turn (drifting load hits both)
        values, warm = {}, {v: [] for v in calls}
        for v, call in calls.items():
            values[v] = float(jax.block_until_ready(call()[0]))
        for _ in range(repeats):
            for v, call in calls.items():
                t0 = time.perf_counter()
                jax.block_until_ready(call()[0])
                warm[v].append(time.perf_counter() - t0)
        return dict(variant=variant, log2_capacity=log2, steps=steps, devices=devices, values=values, warm_s=warm,
                    ratio_of_best=min(warm["sharded"]) / min(warm["unsharded"]) if repeats else None,
                    device=str(jax.devices()[0].device_kind), backend=jax.default_backend())
    call = calls[variant]
    t0 = time.perf_counter()
    value, stats = call()
    value = float(jax.block_until_ready(value))
    first = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        v, _ = call()
        jax.block_until_ready(v)
        warm.append(time.perf_counter() - t0)
        assert float(v) == value, (float(v), value)
    return dict(variant=variant, log2_capacity=log2, capacity=capacity, max_terms=trunc.max_terms,
                min_abs_coeff=min_abs_coeff, steps=steps, devices=devices if variant == "sharded" else 1, value=value,
                first_call_s=first,
                process_to_value_s=time.perf_counter() - t_start - sum(warm), warm_s=warm,
                peak_terms=int(stats.max_terms_seen), dropped_norm=[float(x) for x in np.asarray(stats.dropped_norm)],
                device=str(jax.devices()[0].device_kind), backend=jax.default_backend())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log2-capacity", type=int, default=20)
    ap.add_argument("--fill", type=float, default=0.75, help="max_terms as a fraction of the capacity")
    ap.add_argument("--min-abs-coeff", type=float, default=1e-9)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="warm calls a process")
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes a variant (interleaved)")
    ap.add_argument("--timeout", type=float, default=560.0, help="seconds a process may take")
    ap.add_argument("--cache", action="store_true", help="keep JAX's persistent compilation cache on")
    ap.add_argument("--devices", type=int, default=1, help="devices of the sharded variant's mesh")
    ap.add_argument("--child", choices=VARIANTS + ("alternating",), default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.log2_capacity, args.fill, args.min_abs_coeff, args.steps,
                               args.repeats, args.devices)))
        return
    import benchtools

    # a first call compiles (JAX's persistent cache off, unless --cache); JAX takes 75% of a GPU's memory
    # by default: let a run have nearly all of it (as terms_at_scale.py)
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95", **os.environ}
    if not args.cache:
        env["PAULIPROP_NO_CACHE"] = "1"
    records = []
    for r in range(args.rounds):
        for variant in VARIANTS + ("alternating",):
            cmd = [sys.executable, __file__, "--child", variant, "--log2-capacity", str(args.log2_capacity),
                   "--fill", str(args.fill), "--min-abs-coeff", str(args.min_abs_coeff), "--steps", str(args.steps),
                   "--repeats", str(args.repeats), "--devices", str(args.devices)]
            record = benchtools.child_record(cmd, args.timeout, env, 3000, variant=variant)
            record["round"] = r
            records.append(record)
            print(json.dumps(record), flush=True)
    ok = {v: [rec for rec in records if rec["variant"] == v and "value" in rec] for v in VARIANTS}
    summary = {}
    if all(ok.values()):
        first = {v: statistics.median(rec["first_call_s"] for rec in ok[v]) for v in VARIANTS}
        warm = {v: min(min(rec["warm_s"]) for rec in ok[v]) if args.repeats else None for v in VARIANTS}
        alternating = [rec["ratio_of_best"] for rec in records if rec["variant"] == "alternating" and "warm_s" in rec]
        summary = dict(first_call_median_s=first, warm_best_s=warm, alternating_warm_ratios=alternating,
                       first_call_ratio=first["sharded"] / first["unsharded"],
                       warm_ratio=warm["sharded"] / warm["unsharded"] if args.repeats else None,
                       values={v: sorted({rec["value"] for rec in ok[v]}) for v in VARIANTS},
                       same_value=len({rec["value"] for v in VARIANTS for rec in ok[v]}) == 1,
                       largest_value_difference=max(abs(a["value"] - b["value"]) for a in ok["sharded"]
                                                    for b in ok["unsharded"]))
        print(json.dumps(summary), flush=True)
    import jax

    result = dict(benchmark="sharded_overhead", environment=benchtools.environment(()), git=benchtools.git_state(),
                  args={k: str(v) for k, v in vars(args).items()}, records=records, summary=summary)
    out = args.out
    if out is None and os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / f"sharded_overhead_{jax.default_backend()}.json"
    benchtools.write_result(result, out, "sharded_overhead", jax.default_backend())


if __name__ == "__main__":
    main()
