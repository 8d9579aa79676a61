"""How many live Pauli terms one device holds: the 127-qubit kicked Ising at growing capacity (issue 20).

<Z62> after 20 steps at theta_h = pi/4 (the hardest of the guide's angles), keeping the largest
`fill` x capacity terms after every gate (max_terms) and dropping |c| < --min-abs-coeff, at each
capacity 2^k of --capacities. Each capacity runs in a fresh process, so that the device's peak memory
(`memory_stats()["peak_bytes_in_use"]`) is that run's alone: the first call (compilation included)
and the value, the peak and final live terms, the dropped 1-norm, and the error against the MIX
reference (0.2686; DESIGN.md section 7). One program a capacity; nothing grows.

    python experiments/terms_at_scale.py --capacities 22,24,26,28 --out results/terms_at_scale_h100_DATE.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MIX_Z62_PI4 = 0.2685871422290802  # Begusic, Gray, Chan, column 5b (also in pauliprop.models)


def child(log2: int, fill: float, min_abs_coeff: float, steps: int) -> dict:
    import jax

    jax.config.update("jax_enable_x64", True)
    import numpy as np

    import pauliprop as pp
    from pauliprop import models

    capacity = 1 << log2
    max_terms = int(fill * capacity)
    trunc = pp.Truncation(max_terms=max_terms, min_abs_coeff=min_abs_coeff)
    circuit, obs = models.kicked_ising(steps, math.pi / 4), models.single_z(62)
    t0 = time.perf_counter()
    value, stats = pp.expectation(circuit, obs, truncation=trunc, capacity=capacity, return_stats=True)
    value = float(value)
    seconds = time.perf_counter() - t0
    mem = jax.devices()[0].memory_stats() or {}
    peak_bytes = mem.get("peak_bytes_in_use")
    return dict(log2_capacity=log2, capacity=capacity, max_terms=max_terms, min_abs_coeff=min_abs_coeff,
                steps=steps, value=value, abs_error_mix=abs(value - MIX_Z62_PI4) if steps == 20 else None,
                first_call_s=seconds, peak_terms=int(stats.max_terms_seen), final_terms=int(np.asarray(stats.terms)[-1]),
                dropped_norm=[float(v) for v in np.asarray(stats.dropped_norm)], overflow=bool(stats.overflow),
                peak_bytes=peak_bytes, bytes_per_slot=peak_bytes / capacity if peak_bytes else None,
                device=str(jax.devices()[0].device_kind))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacities", default="20,22,24", help="log2 of the capacities, comma separated")
    ap.add_argument("--fill", type=float, default=0.75, help="max_terms as a fraction of the capacity")
    ap.add_argument("--min-abs-coeff", type=float, default=1e-9)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=480.0, help="seconds a capacity may take")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.fill, args.min_abs_coeff, args.steps)))
        return
    import benchtools

    records = []
    for log2 in (int(k) for k in args.capacities.split(",")):
        cmd = [sys.executable, __file__, "--child", str(log2), "--fill", str(args.fill),
               "--min-abs-coeff", str(args.min_abs_coeff), "--steps", str(args.steps)]
        # JAX takes 75% of a GPU's memory by default: let the run have nearly all of it
        env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95", **os.environ}
        record = benchtools.child_record(cmd, args.timeout, env, 2000, log2_capacity=log2)
        records.append(record)
        print(json.dumps(record), flush=True)
        if record.get("status"):  # a larger capacity will not do better
            break
    import jax  # only now: the parent holds no device memory while the runs need it

    result = dict(benchmark="terms_at_scale", environment=benchtools.environment(()), git=benchtools.git_state(),
                  args={k: str(v) for k, v in vars(args).items()}, records=records)
    benchtools.write_result(result, args.out, "terms_at_scale", jax.default_backend())


if __name__ == "__main__":
    main()
