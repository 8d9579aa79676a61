"""Where a warm GPU propagation's time goes: each kernel's launches and device time.

For the workloads of native_peers.py (`ki`, `isingL`; gpu_compile_parts.case_circuit), pp.expectation runs until
warm (the last warm call's seconds are recorded), then one call runs under jax.profiler
(benchtools.device_kernels): the call's span, the sum of the device's kernel times, and for each kernel name its
launches and total time, split by duration (under 10 us, under 50 us, longer: passes over few words and over
many). Beside them the passes (the pairing's insert kernel's launches) and the run's term-ops (the live terms
after each operation, summed). With command buffers on (the default, as users run), the profiler sees each
kernel of the CUDA graph once: `--no-command-buffers` compiles the program without them so that every launch
is seen (the run is slower then: each launch waits for the host).

    python experiments/probes/gpu_warm_profile.py --cases ki,ising4,ising8 --out experiments/results/gpu_warm_profile_h100_<date>.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("PAULIPROP_HOST_FIRST", "0")
# no stored programs: they are keyed by pauliprop's source, not by the constants --fused sets (an A/B of two
# constants in one machine would time the first one's program twice)
os.environ["PAULIPROP_NO_CACHE"] = "1"
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # probes/, experiments/

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import numpy as np  # noqa: E402

import benchtools  # noqa: E402
import pauliprop as pp  # noqa: E402
from gpu_compile_parts import case_circuit  # noqa: E402


def profile(name: str, warm_runs: int) -> dict:
    circuit, obs, trunc = case_circuit(name)
    value = pp.expectation(circuit, obs, truncation=trunc)
    for _ in range(warm_runs):
        t0 = time.perf_counter()
        pp.expectation(circuit, obs, truncation=trunc)
    warm = time.perf_counter() - t0
    _, stats = pp.propagate(circuit, obs, truncation=trunc)
    terms = np.asarray(stats.terms, np.float64)
    prof = benchtools.device_kernels(lambda: pp.expectation(circuit, obs, truncation=trunc), top=40, bounds_us=(10, 50))
    passes = sum(c for n, _, c in prof["top"] if "insert" in n)
    rec = dict(case=name, value=float(value), warm_s=warm, ops=len(terms), term_ops=float(terms.sum()),
               peak_terms=int(stats.max_terms_seen), passes_seen=passes, **prof)
    print(json.dumps({k: v for k, v in rec.items() if k != "top"}), flush=True)
    for n, ms, c in prof["top"]:
        print(f"   {c:7d} {ms:9.2f} ms {1e3 * ms / c:8.1f} us  {n[:40]:40s} by duration <10/<50/more us: "
              f"{prof['by_duration'][n]}", flush=True)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="ki,ising4,ising8")
    ap.add_argument("--warm-runs", type=int, default=2)
    ap.add_argument("--fused", default="{}", help='the fused kernels\' module constants, e.g. \'{"PROGRAMS_PER_CORE": 8}\'')
    ap.add_argument("--no-command-buffers", action="store_true",
                    help="compile the tiled program without CUDA graphs, so that the profile sees every launch")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.no_command_buffers:
        from pauliprop.propagation import propagate
        propagate.GPU_TILED_OPTIONS = {"xla_gpu_enable_command_buffer": ""}
    from pauliprop.propagation import fused
    for k, v in json.loads(a.fused).items():
        assert hasattr(fused, k), k
        setattr(fused, k, v)
    res = dict(benchtools.environment(()), fused=json.loads(a.fused), command_buffers=not a.no_command_buffers, source=pp.__file__, records=[])
    for name in a.cases.split(","):
        res["records"].append(profile(name, a.warm_runs))
        benchtools.write_result(res, a.out, "gpu_warm_profile", "gpu")


if __name__ == "__main__":
    main()
