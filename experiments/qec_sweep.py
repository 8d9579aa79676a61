"""A threshold sweep as QEC users run it: rotated surface-code memory circuits, d = 3, 5, 7, 9 times four
noise strengths, each sampled once, with our detector sampler and with Stim's.

Two measurements, each in fresh processes with an empty persistent compilation cache (its own
temporary directory), so compilations are included:

  sampling  one process per tool samples the 16 circuits in turn (compile_detector_sampler, then
            `shots` bit-packed shots with separated observables): total wall time, time per task,
            and for ours the programs compiled (JAX's compile log, benchtools.watch_compilations);
            ours again in a second process on the cache the first one filled ("ours_cached": what
            a user's next sweep costs). With a GPU, also NVIDIA cuStabilizer ("custabilizer",
            cuquantum.stabilizer 26.x, where it imports): its frame simulator's measurement flips on
            the GPU, copied to the host bit-packed and made detection events and observable flips by
            Stim's converter (`detections_from_flips`), the data the other two give; its GPU part
            alone is `gpu_s` a task. "ours-host": ours with STABILIZER_NATIVE=host, the C loops on
            the host's cores beside the GPU (nothing compiled), for the GPU machine's comparison
  sinter    sinter.collect over the 16 tasks with decoders=["ours"] and
            custom_decoders={"ours": stabilizer.SinterSampler()} (PyMatching), and with sinter's
            default (stim + PyMatching), both num_workers=1 and max_shots=`shots`: wall time, the
            programs our workers compiled (entries written to the empty cache), and the logical error
            rates side by side with their difference in sigma. sinter before 1.16 fails on numpy 2's integer
            counts in its own stim sampler (AnonTaskStats asserts ints): there the default's sampler runs
            with them converted (`StimPyMatching`), recorded as `default_path`

Writes experiments/results/qec_sweep_<backend>_<date>.json (hardware, date, git commit) and, with
matplotlib, a threshold plot beside it.

    python experiments/qec_sweep.py [--shots 100000] [--tools ours,stim,custabilizer] [--out PATH]

The workers run on the parent's JAX platform (a GPU where there is one). Until 2026-12-07 they were
forced to the CPU (JAX_PLATFORMS=cpu): the H200 run of 2026-11-28 sampled ours on that machine's 16
CPU cores, not its GPU.

Measured 2026-11-28 on the 2-core CPU (shared with another job's test runs), full 1e5 shots a task
(qec_sweep_cpu_2026-11-28.json): sampling the 16 tasks took ours 21.1 s on an empty cache (37
programs, 14.4 s of XLA compilation: four frame programs, one a distance, about 3.5 s each; no task
after a distance's first compiled anything), 7.4 s on the cache that run filled, Stim 2.6 s: 8.0x
and 2.8x Stim, short of the issue's 2x. sinter.collect: ours 37.9 s, stim + PyMatching 20.7 s; every
task's logical error rate within 1.9 sigma of sinter's default.

2026-11-29, the same 2-core CPU (load 2.4-2.7 from another job), with the samplers' C engine
(stabilizer/frames/native.py; qec_sweep_cpu_2026-11-29_c.json): sampling 3.1 s on an empty cache and
3.2 s on a filled one against Stim's 7.1 s in the same run (0.44x), nothing compiled (no program in
either cache); sinter.collect ours 34.7 s, stim + PyMatching 32.5 s (decoding dominates both), every
task within 1.7 sigma.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchtools

DISTANCES = (3, 5, 7, 9)
PROBABILITIES = (1e-3, 3e-3, 6e-3, 1e-2)


def circuit(d: int, p: float):
    import stim

    return stim.Circuit.generated("surface_code:rotated_memory_z", distance=d, rounds=d, after_clifford_depolarization=p,
                                  before_measure_flip_probability=p, after_reset_flip_probability=p,
                                  before_round_data_depolarization=p)


def sampling_worker(tool: str, shots: int) -> dict:
    """Sample every task once in this process: wall times and (ours) compilations."""
    compiles, hits, stages = benchtools.watch_compilations()
    t_import = time.perf_counter()
    gpu_s = []
    if tool in ("ours", "ours-host"):
        import stabilizer as st

        def sample(c):
            return st.compile_detector_sampler(st.Circuit(c)).sample(shots, separate_observables=True, bit_packed=True)
    elif tool == "custabilizer":
        def sample(c):
            t = time.perf_counter()
            flips = custabilizer_flips(c, shots)
            gpu_s.append(time.perf_counter() - t)
            return detections_from_flips(c, flips, shots)
    else:
        def sample(c):
            return c.compile_detector_sampler().sample(shots, separate_observables=True, bit_packed=True)
    import_s = time.perf_counter() - t_import
    tasks, t0 = [], time.perf_counter()
    for d in DISTANCES:
        for p in PROBABILITIES:
            c = circuit(d, p)
            n0, t = len(compiles), time.perf_counter()
            dets, _ = sample(c)
            tasks.append({"d": d, "p": p, "seconds": time.perf_counter() - t, "compiled": len(compiles) - n0,
                          **({"gpu_s": gpu_s[-1]} if gpu_s else {}),
                          "detection_rate": float(sum(bin(b).count("1") for b in dets[:2000].ravel().tolist()))
                          / (2000 * c.num_detectors)})
    return {"tool": tool, "import_s": import_s, "total_s": time.perf_counter() - t0, "compiled": len(compiles),
            "cache_hits": len(hits), "compile_stages_s": stages, "tasks": tasks}


def custabilizer_flips(c, shots: int):
    """NVIDIA cuStabilizer's measurement flips of `shots` frames of circuit c (a stim.Circuit), on the host,
    bit-packed as it gives them: (measurements, shot bytes), shots little-endian in each byte. A fresh
    FrameSimulator a task (its tables start from zero frames), as stabilizer_bench.custabilizer_surface."""
    import inspect

    import cupy as cp
    from cuquantum.stabilizer import Circuit, FrameSimulator

    extra = {"num_detectors": c.num_detectors} if "num_detectors" in inspect.signature(FrameSimulator).parameters else {}
    sim = FrameSimulator(c.num_qubits, shots, c.num_measurements, package="cupy", **extra)
    sim.apply(Circuit(str(c)))
    return cp.asnumpy(sim.get_measurement_bits(bit_packed=True))[:c.num_measurements]


def detections_from_flips(c, flips, shots: int) -> tuple:
    """(detection events, observable flips), bit-packed a shot a row as Stim's detector sampler gives them,
    from a frame simulator's packed measurement flips ((measurements, shot bytes), shots little-endian):
    the flips XOR the circuit's noiseless reference sample, through Stim's measurements-to-detections
    converter."""
    import numpy as np

    bits = np.unpackbits(np.asarray(flips, np.uint8), axis=1, count=shots, bitorder="little").T
    measured = bits.astype(bool) ^ c.reference_sample()[None, :]
    return c.compile_m2d_converter().convert(measurements=measured, separate_observables=True, bit_packed=True)


def sinter_counts_numpy_integers() -> bool:
    """Whether sinter's own stim sampler fails on this numpy: sinter before 1.16 asserts
    `isinstance(errors, int)` in AnonTaskStats, and its StimThenDecodeSampler counts errors with numpy
    (under numpy 2 np.count_nonzero returns a numpy integer), so every task of its default worker raised
    AssertionError (sinter 1.15.0, numpy 2.5.2, the H200 machine, 2026-11-28). sinter 1.16 dropped the
    assertion. Our SinterSampler counts in Python ints either way."""
    import numpy as np
    import sinter

    try:
        sinter.AnonTaskStats(shots=1, errors=np.int64(0))
    except AssertionError:
        return True
    return False


def accept_numpy_counts() -> None:
    """Convert numpy integer counts to ints before AnonTaskStats's checks, in this process (a sinter
    worker calls it through StimPyMatching): the only change to sinter's default path."""
    import numpy as np
    from sinter._data._anon_task_stats import AnonTaskStats

    check = AnonTaskStats.__post_init__
    if getattr(check, "accepts_numpy_counts", False):
        return

    def post_init(self):
        for name in ("shots", "errors", "discards"):
            if isinstance(getattr(self, name), np.integer):
                object.__setattr__(self, name, int(getattr(self, name)))  # a frozen dataclass
        check(self)

    post_init.accepts_numpy_counts = True
    AnonTaskStats.__post_init__ = post_init


try:
    import sinter as _sinter
except ImportError:  # the sampling mode needs no sinter
    _sinter = None

if _sinter is not None:
    class StimPyMatching(_sinter.Sampler):
        """sinter's default sampler (StimThenDecodeSampler: stim's detector sampler, then the built-in
        decoder), built in the worker after `accept_numpy_counts`, for sinter versions that fail on
        numpy integer counts. Module-level, so that sinter's spawned workers can unpickle it."""

        def __init__(self, decoder: str = "pymatching"):
            self.decoder = decoder

        def compiled_sampler_for_task(self, task):
            from sinter._decoding._stim_then_decode_sampler import StimThenDecodeSampler

            accept_numpy_counts()
            return StimThenDecodeSampler(decoder=_sinter.BUILT_IN_DECODERS[self.decoder], count_observable_error_combos=False,
                                         count_detection_events=False, tmp_dir=None).compiled_sampler_for_task(task)


def custabilizer_imports() -> bool:
    try:
        import cupy  # noqa: F401
        from cuquantum.stabilizer import FrameSimulator  # noqa: F401
    except Exception:  # no GPU, or no cuQuantum: the column is left out
        return False
    return True


def sinter_run(tool: str, shots: int) -> dict:
    """sinter.collect over the tasks with our sampler or sinter's default: wall time and stats. Where
    sinter's default fails on numpy's integers (`sinter_counts_numpy_integers`), the default's own
    sampler runs with them converted (`StimPyMatching`); `default_path` says which ran."""
    import sinter

    import stabilizer

    tasks = [sinter.Task(circuit=circuit(d, p), json_metadata={"d": d, "p": p}) for d in DISTANCES for p in PROBABILITIES]
    decoder, extra, path = "pymatching", {}, "sinter's built-in pymatching"
    if tool == "ours":
        decoder, extra, path = "ours", {"custom_decoders": {"ours": stabilizer.SinterSampler()}}, None
    elif sinter_counts_numpy_integers():
        decoder, path = "stim-pymatching", "StimThenDecodeSampler(pymatching), numpy counts converted (sinter < 1.16)"
        extra = {"custom_decoders": {decoder: StimPyMatching("pymatching")}}
    t0 = time.perf_counter()
    stats = sinter.collect(num_workers=1, tasks=tasks, decoders=[decoder], max_shots=shots, **extra)
    wall = time.perf_counter() - t0
    rows = sorted(({"d": s.json_metadata["d"], "p": s.json_metadata["p"], "shots": s.shots, "errors": s.errors,
                    "seconds": s.seconds} for s in stats), key=lambda r: (r["d"], r["p"]))
    return {"tool": tool, "wall_s": wall, "tasks": rows, "default_path": path, "sinter": sinter.__version__}


def isolated(mode: str, tool: str, shots: int, cache: str | None = None) -> dict:
    """Run `mode` for `tool` in a fresh process with the persistent cache in `cache` (None: a new empty
    temporary directory); count the programs in it afterwards."""
    with tempfile.TemporaryDirectory() as fresh:
        cache = cache or fresh
        env = os.environ | {"PAULIPROP_CACHE_DIR": cache}
        if tool == "ours-host":
            env["STABILIZER_NATIVE"] = "host"
        env.pop("PAULIPROP_NO_CACHE", None)
        cmd = [sys.executable, __file__, "--child", mode, tool, "--shots", str(shots)]
        record = benchtools.child_record(cmd, 3600, env, 4000, mode=mode, tool=tool)
        record["programs_in_cache"] = sum(1 for f in Path(cache).rglob("*") if f.is_file() and "-atime" not in f.name)
    return record


def sampling_runs(shots: int, tools: list) -> dict:
    """Stim's sampling, ours on an empty cache, ours again on the cache that run filled, and the other tools."""
    runs = {}
    with tempfile.TemporaryDirectory() as cache:
        if "ours" in tools:
            runs = {"ours": isolated("sampling", "ours", shots, cache),
                    "ours_cached": isolated("sampling", "ours", shots, cache)}
    return runs | {t: isolated("sampling", t, shots) for t in tools if t != "ours"}


def sigma_apart(a: dict, b: dict) -> float:
    pa, pb = a["errors"] / a["shots"], b["errors"] / b["shots"]
    pooled = (a["errors"] + b["errors"]) / (a["shots"] + b["shots"])
    var = max(pooled * (1 - pooled), 1 / (a["shots"] + b["shots"])) * (1 / a["shots"] + 1 / b["shots"])
    return abs(pa - pb) / var**0.5


def plot(result: dict, path: Path) -> Path | None:
    plt = benchtools.pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for tool, style in (("ours", "o-"), ("stim", "x--")):
        rows = result["sinter"][tool]["tasks"]
        for i, d in enumerate(DISTANCES):
            pts = [(r["p"], r["errors"] / r["shots"], r["errors"] ** 0.5 / r["shots"]) for r in rows
                   if r["d"] == d and r["errors"]]  # no errors: no point on a log scale
            ax.errorbar([x for x, _, _ in pts], [y for _, y, _ in pts], yerr=[e for _, _, e in pts], fmt=style,
                        color=f"C{i}", label=f"d={d} {'ours' if tool == 'ours' else 'stim'}+pymatching", ms=4)
    ax.set(xscale="log", yscale="log", xlabel="physical error rate p", ylabel="logical error rate per shot",
           title="rotated surface code memory (d rounds), sinter + PyMatching")
    ax.legend(fontsize=7, ncol=2)
    benchtools.save_figure(fig, path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shots", type=int, default=100_000)
    ap.add_argument("--tools", default="ours,stim,custabilizer",
                    help="samplers: ours, ours-host (STABILIZER_NATIVE=host), stim, custabilizer (a GPU's; left out "
                         "where cuquantum does not import)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "TOOL"))
    args = ap.parse_args()
    if args.child:
        mode, tool = args.child
        out = sampling_worker(tool, args.shots) if mode == "sampling" else sinter_run(tool, args.shots)
        print(json.dumps(out))
        return
    tools = [t for t in args.tools.split(",") if t != "custabilizer" or custabilizer_imports()]
    result = {"environment": benchtools.environment(("stim", "sinter", "pymatching", "cuquantum-python-cu12",
                                                     "cuquantum-python-cu13")),
              "git": benchtools.git_state(), "shots": args.shots, "distances": DISTANCES,
              "probabilities": PROBABILITIES, "sampling": sampling_runs(args.shots, tools),
              "sinter": {t: isolated("sinter", t, args.shots) for t in ("ours", "stim")}}
    ours, stim_ = (result["sinter"][t].get("tasks", []) for t in ("ours", "stim"))
    result["error_rates"] = [{"d": a["d"], "p": a["p"], "ours": a["errors"] / a["shots"], "stim": b["errors"] / b["shots"],
                              "sigma_apart": sigma_apart(a, b)} for a, b in zip(ours, stim_)]
    s = result["sampling"]
    result["summary"] = {
        "sampling_total_s": {t: s[t].get("total_s") for t in s},
        "sampling_ratio_to_stim": {t: s[t].get("total_s", 0) / max(s.get("stim", {}).get("total_s", 1e-9), 1e-9)
                                   for t in s if t != "stim"},
        "sampling_compiled": {t: s[t].get("compiled") for t in ("ours", "ours_cached") if t in s},
        "sampling_compile_s": {t: s[t].get("compile_stages_s") for t in ("ours", "ours_cached") if t in s},
        "sinter_wall_s": {t: result["sinter"][t].get("wall_s") for t in ("ours", "stim")},
        "sinter_programs_compiled_ours": result["sinter"]["ours"]["programs_in_cache"],
        "max_sigma_apart": max((r["sigma_apart"] for r in result["error_rates"]), default=None)}
    out = benchtools.write_result(result, args.out, "qec_sweep", result["environment"]["jax_backend"])
    figure = plot(result, out.with_suffix(".png"))
    print(json.dumps(result["summary"], indent=1), figure)


if __name__ == "__main__":
    main()
