"""The frame program alone (`stabilizer.frames.run_program`, blocked until ready), surface-code memory_z
circuits (rounds = d, p on every noise knob): the GPU frame kernel against the scan, or the kernel's
block and tile sizes against each other. Issue 18.

  python experiments/frame_kernel_probe.py engines --distances 5,17 --shots 1e5,1e6
  python experiments/frame_kernel_probe.py configs --distances 5,17 --shots 1e5,1e6

`engines` times kernel="pallas" (on a CPU "interpret") and kernel="jax" (the scan); `configs` times the kernel for several
(BLOCK_WORDS, NUM_WARPS, TILE, HITS), each after jax.clear_caches() so that `first_s` includes tracing
and compiling. Results are written after every measurement (a time limit keeps what was measured).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import stim

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchtools  # noqa: E402

from stabilizer import Circuit, compile_detector_sampler  # noqa: E402
from stabilizer.frames import frame_kernel as K  # noqa: E402
from stabilizer.frames import frames as F  # noqa: E402

KERNEL = "pallas" if jax.default_backend() == "gpu" else "interpret"  # the interpreter: a CPU check of the script
CONFIGS = [(32, 4, 32, 128), (32, 2, 32, 128), (16, 2, 32, 64), (32, 4, 16, 128), (64, 4, 32, 128), (32, 8, 64, 256)]


def surface(d: int, p: float) -> Circuit:
    return Circuit(str(stim.Circuit.generated(
        "surface_code:rotated_memory_z", distance=d, rounds=d, after_clifford_depolarization=p,
        before_round_data_depolarization=p, before_measure_flip_probability=p, after_reset_flip_probability=p)))


def timed(sampler, words: int, kernel: str, repeats: int) -> dict:
    prog = sampler.program
    run = lambda: jax.block_until_ready(F.run_program(sampler._structure, sampler._tables, jax.random.key(0),
                                                      prog.num_qubits, prog.num_measurements, words, kernel=kernel,
                                                      limits=sampler._limits))
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    warm = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        warm.append(time.perf_counter() - t0)
    return {"first_s": first, "warm_s": warm, "best_s": min(warm)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["engines", "configs"])
    ap.add_argument("--distances", default="5,17")
    ap.add_argument("--shots", default="1e5,1e6")
    ap.add_argument("--p", type=float, default=1e-3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("frame_kernel_probe.json"))
    args = ap.parse_args(argv)
    result = {"meta": benchtools.environment(("stim",)) | {"args": vars(args) | {"out": str(args.out)}}, "records": []}
    for d in map(int, args.distances.split(",")):
        sampler = compile_detector_sampler(surface(d, args.p), seed=1)
        for shots in (int(float(s)) for s in args.shots.split(",")):
            words = -(-(-(-shots // 32)) // 128) * 128
            variants = [("engine", k) for k in (KERNEL, "jax")] if args.mode == "engines" else \
                [("config", c) for c in CONFIGS]
            for what, value in variants:
                if what == "config":
                    K.BLOCK_WORDS, K.NUM_WARPS, K.TILE, K.HITS = value
                    jax.clear_caches()
                r = {"d": d, "shots": shots, "words": words, what: value}
                r |= timed(sampler, words, value if what == "engine" else KERNEL, args.repeats)
                print(d, shots, value, f"first {r['first_s']:.2f} s, warm {[round(1e3 * t, 2) for t in r['warm_s']]} ms",
                      flush=True)
                result["records"].append(r)
                args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
