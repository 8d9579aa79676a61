"""How much of the detector sampler's time is noise sampling (issue 4: which GPU loops need kernels).

The rotated surface code (memory_z, rounds = d, p = 1e-3 everywhere, 1e5 shots) is sampled three
ways: as generated; with every noise probability set to 0 (the noise ops are still scanned, their
sampling is skipped); and with the noise instructions removed. Best of three calls after a warm-up,
written to experiments/results/.

Usage: python experiments/sampler_noise_cost.py [--distances 11,25] [--shots 100000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchtools  # noqa: E402


def best_time(circuit, shots: int, repeats: int = 3) -> float:
    import stabilizer as st

    sampler = st.compile_detector_sampler(st.Circuit(circuit), seed=1)
    sampler.sample(shots)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sampler.sample(shots)
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None):
    import jax
    import stim

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--distances", default="11,25")
    ap.add_argument("--shots", type=int, default=100_000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    out = args.out or benchtools.default_out("sampler_noise_cost", jax.default_backend())
    records = []
    for d in map(int, args.distances.split(",")):
        noisy = stim.Circuit.generated("surface_code:rotated_memory_z", distance=d, rounds=d,
                                       after_clifford_depolarization=1e-3, before_measure_flip_probability=1e-3,
                                       after_reset_flip_probability=1e-3, before_round_data_depolarization=1e-3)
        variants = {"noisy": noisy, "noise p=0": stim.Circuit(str(noisy).replace("(0.001)", "(0)")),
                    "no noise instructions": noisy.without_noise()}
        rec = {"d": d, "shots": args.shots} | {name: best_time(c, args.shots) for name, c in variants.items()}
        records.append(rec)
        print(json.dumps(rec), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": benchtools.environment(("stim",)) | {"args": vars(args) | {"out": str(out)}},
                               "records": records}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
