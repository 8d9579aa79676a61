"""Where a detector sampler's first call and its host copies spend their time (issue 18).

  python experiments/probes/stabilizer_probe.py first-call --out results/x.json
      d = 5 surface code (rounds 5, p = 1e-3): first and second `sample` of 1e5 and 1e6 shots, bit-packed
      and bool, with JAX's compile log on stderr (which program compiled, and for how long); then the
      device-to-host copy of 16 MB, 165 MB and 1.44 GB through np.asarray (pageable memory) and through
      `jax.device_put` into pinned host memory.
  XLA_FLAGS=... python experiments/probes/stabilizer_probe.py compile --words 32768
      the compilation of the d = 5 frame program alone for `words` words (32 shots each): run it once per
      XLA flag set to see which compiler stage grows with the shot count.
  python experiments/probes/stabilizer_probe.py profile --distance 17 --shots 100000
      the warm frame program of one chunk under JAX's profiler: the ops it runs, the device's kernels
      (count and time by name), device-to-host copies (each a wait for the host), and how much of the
      span the device was busy: per op, what the program costs beyond its arithmetic.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # probes/, experiments/
from benchtools import device_kernels  # noqa: E402


def surface(d: int) -> str:
    import stim

    return str(stim.Circuit.generated("surface_code:rotated_memory_z", distance=d, rounds=d,
                                      after_clifford_depolarization=1e-3, before_measure_flip_probability=1e-3,
                                      after_reset_flip_probability=1e-3, before_round_data_depolarization=1e-3))


def first_call() -> dict:
    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp
    import numpy as np

    import stabilizer as st

    res = {"import_s": time.perf_counter() - t0}
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(relativeCreated)d %(message)s")
    jax.config.update("jax_log_compiles", True)
    s = st.compile_detector_sampler(surface(5), seed=1)
    for shots in (100_000, 1_000_000):
        res[f"plan_{shots}"] = s._plan(shots)
        for mode, kw in (("packed", {"bit_packed": True}), ("bool", {})):
            times = []
            for _ in range(2):
                t = time.perf_counter()
                s.sample(shots, separate_observables=True, **kw)
                times.append(time.perf_counter() - t)
            res[f"d5_{shots}_{mode}"] = times  # [first, second]
            print(mode, shots, times, file=sys.stderr, flush=True)
    jax.config.update("jax_log_compiles", False)
    for mb in (16, 165, 1440):
        x = jax.block_until_ready(jax.random.bits(jax.random.key(0), (mb * 1000, 1000), jnp.uint8))
        r = {}
        for name in ("default", "pinned", "pinned_then_np"):
            times = []
            for _ in range(3):
                y = jax.block_until_ready(jnp.copy(x))  # a fresh array: an array caches its host copy
                t = time.perf_counter()
                if name == "default":
                    np.asarray(y)
                else:
                    p = jax.block_until_ready(jax.device_put(y, y.sharding.with_memory_kind("pinned_host")))
                    if name == "pinned_then_np":
                        np.asarray(p)
                times.append(time.perf_counter() - t)
            r[name] = min(times)
        res[f"transfer_{mb}MB"] = r
        print(mb, r, file=sys.stderr, flush=True)
    return res


def compile_only(words: int) -> dict:
    import jax

    import stabilizer as st
    from stabilizer.frames import frames

    s = st.compile_detector_sampler(surface(5), seed=1)
    prog = s.program
    with jax.enable_x64(True):
        lowered = frames._run_program.trace(s._structure, s._tables, jax.random.key(0), prog.num_qubits,
                                            prog.num_measurements, words, "auto", s._limits).lower()
    t = time.perf_counter()
    lowered.compile()
    return {"words": words, "xla_flags": os.environ.get("XLA_FLAGS", ""), "compile_s": time.perf_counter() - t}


def profile(distance: int, shots: int) -> dict:
    import jax
    import numpy as np

    import stabilizer as st
    from stabilizer.frames import frames

    s = st.compile_detector_sampler(surface(distance), seed=1)
    prog = s.program
    (start, n, words), = s._plan(shots)

    def ops(structure, tables, times=1):
        total = 0
        for shape, table in zip(structure, tables):
            total += times * (len(np.asarray(table["kind"])) if shape == "table" else ops(shape[2], table, times * shape[1]))
        return total

    run = lambda: frames.run_program(s._structure, s._tables, jax.random.key(0), prog.num_qubits,
                                     prog.num_measurements, words, limits=s._limits).block_until_ready()
    run()
    best = min(_timed(run) for _ in range(3))
    kernels = device_kernels(run)
    total_ops = ops(s._structure, s._tables)
    return {"distance": distance, "shots": shots, "words": words, "ops_run": total_ops, "warm_s": best, **kernels,
            "us_per_op": 1e6 * best / total_ops, "kernels_per_op": kernels["device_events"] / total_ops}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["first-call", "compile", "profile"])
    ap.add_argument("--words", type=int, default=32768)
    ap.add_argument("--distance", type=int, default=17)
    ap.add_argument("--shots", type=int, default=100000)
    ap.add_argument("--out")
    args = ap.parse_args()
    res = (first_call() if args.what == "first-call" else compile_only(args.words) if args.what == "compile"
           else profile(args.distance, args.shots))
    print(json.dumps(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
