"""The GPU's first propagation program: trace, lowering and XLA compile seconds, XLA's compile by TraceMe name,
and compile options tried on the same lowered program (each one's compile seconds and warm run seconds).

The program is the one a GPU call of pp.expectation compiles first (propagate._tiled_call(...).first_program(),
the tiled engine with the fused Pallas kernels), for the workloads of native_peers.py: `ki` (127-qubit kicked
Ising at pi/4) and `isingL` (2D Ising L x L); and `chainN`, large_n.py's local case on N qubits. The persistent cache is off; the host-first path is off. Each
variant compiles the same lowered program again after jax.clear_caches() and runs it RUNS times (the first
variant under jax.profiler when PROF=1: its compile is slower by the profiler; the aggregate and a timeline
of events over 1 ms are written beside the results). An A/B of two source trees runs this once per tree with
SRC set to each (experiments/HISTORY.md, "The insert kernel's fold as a loop").

    SRC=<tree holding pauliprop> CASES=ki,ising8 TAG=new VARIANTS='{"base": {}, "base2": {}}' OUT=<dir> \
        python experiments/probes/gpu_compile_parts.py

FUSED='{"NUM_WARPS": 8}' sets the fused kernels' constants before anything is traced (an A/B of kernel shapes).
"""
import collections, json, os, sys, time, math, glob
os.environ["PAULIPROP_HOST_FIRST"] = "0"
os.environ["PAULIPROP_NO_CACHE"] = "1"
SRC = os.environ.get("SRC")
if SRC:
    sys.path.insert(0, SRC)
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # probes/, experiments/
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
import pauliprop as pp
from pauliprop import models
from pauliprop.propagation import propagate as PR
import native_peers as NP

OUT = os.environ.get("OUT", "/tmp")
PROF = os.environ.get("PROF", "1") == "1"
TAG = os.environ.get("TAG", "x")
VARIANTS = json.loads(os.environ.get("VARIANTS", '{"base": {}}'))
RUNS = int(os.environ.get("RUNS", "3"))
# FUSED='{"BLOCK": 512, "NUM_WARPS": 8}': the fused kernels' module constants for this process (words a program
# handles, warps a program), set before anything is traced
from pauliprop.propagation import fused as _fused
for _k, _v in json.loads(os.environ.get("FUSED", "{}")).items():
    assert hasattr(_fused, _k), _k
    setattr(_fused, _k, _v)


def case_circuit(name):
    if name.startswith("chain"):  # large_n.py's `local` case on a chain of N qubits: words of N / 32 lanes
        from large_n import TRUNCATION, brickwork
        n = int(name[5:])
        return brickwork(pp, n, 5), pp.PauliSum.from_list([("Z", [n // 2], 1.0)], n), pp.Truncation(**TRUNCATION)
    if name == "ki":
        circuit = models.kicked_ising(20, math.pi / 4, -math.pi / 2)
        return circuit, pp.PauliSum.from_list([("Z", [62], 1.0)], 127), pp.Truncation(min_abs_coeff=1e-4, max_weight=8)
    L = int(name[5:])
    prob = NP.problem({"workload": "ising2d", "L": L, "steps": 21})
    circuit = pp.Circuit(prob["n"])
    for _ in range(21):
        for g, q, a in prob["step"]:
            getattr(circuit, g)(*q, a)
    obs = pp.PauliSum.from_list([("ZZ", list(prob["obs"][1]), 1.0)], prob["n"])
    return circuit, obs, pp.Truncation(min_abs_coeff=1e-6)

def agg(path):
    from jax.profiler import ProfileData
    pd = ProfileData.from_file(path)
    tot = collections.Counter(); cnt = collections.Counter()
    for plane in pd.planes:
        if "host" not in plane.name.lower() and "CPU" not in plane.name:
            continue
        for line in plane.lines:
            for ev in line.events:
                tot[ev.name] += ev.duration_ns / 1e9; cnt[ev.name] += 1
    lines = {}
    t0 = min(ev.start_ns for plane in pd.planes for line in plane.lines for ev in line.events) if pd.planes else 0
    for plane in pd.planes:
        for line in plane.lines:
            evs = [(ev.name, round((ev.start_ns - t0) / 1e6, 2), round(ev.duration_ns / 1e6, 2),
                    [(str(k), str(v)[:80]) for k, v in list(ev.stats)[:4]]) for ev in line.events if ev.duration_ns > 1e6]
            if evs:
                lines[plane.name + "|" + line.name] = evs
    json.dump(lines, open(path + ".timeline.json", "w"))
    return [(k, round(v, 4), cnt[k]) for k, v in tot.most_common(80)]

def main():
    res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "fused": {k: getattr(_fused, k) for k in ("BLOCK", "NUM_WARPS")}}
    for name in os.environ.get("CASES", "ki,ising8").split(","):
        circuit, obs, trunc = case_circuit(name)
        table = PR.state_table("0", circuit.num_qubits, obs.num_lanes)
        call = PR._tiled_call(circuit, obs, None, trunc, 1 << 40, table)
        program, args = call.first_program()
        t0 = time.perf_counter(); tr = program.trace(*args); t1 = time.perf_counter()
        lo = tr.lower(); t2 = time.perf_counter()
        r = dict(trace=t1 - t0, lower=t2 - t1, variants={})
        print(name, "trace %.3f lower %.3f" % (r["trace"], r["lower"]), flush=True)
        for i, (vname, opts) in enumerate(VARIANTS.items()):
            jax.clear_caches()
            prof = PROF and i == 0
            d = os.path.join(OUT, f"prof_{TAG}_{name}")
            if prof:
                jax.profiler.start_trace(d)
            t2 = time.perf_counter()
            try:
                comp = lo.compile(compiler_options={**PR.GPU_TILED_OPTIONS, **opts})
            except Exception as e:
                print("  ", vname, "FAILED", repr(e)[:300], flush=True)
                continue
            t3 = time.perf_counter()
            if prof:
                jax.profiler.stop_trace()
            text = comp.as_text() or ""
            v = dict(compile=t3 - t2, hlo_chars=len(text), triton=text.count("__gpu$xla.gpu.triton"),
                     fusions=text.count("kind=k"), whiles=text.count(" while("), conds=text.count(" conditional("))
            if prof:
                f = glob.glob(d + "/**/*.xplane.pb", recursive=True)
                v["top"] = agg(f[0])
                import shutil; shutil.copy(f[0] + ".timeline.json", os.path.join(OUT, f"timeline_{TAG}_{name}.json"))
                with open(os.path.join(OUT, f"compile_{TAG}_{name}.hlo.txt"), "w") as fh:
                    fh.write(text)
            # warm runs of this executable
            work = PR._take_workspace(call.capacity, call.lanes, call.dtype)
            a = call.first_args(work)
            times, val = [], None
            for _ in range(RUNS):
                t4 = time.perf_counter()
                st, val = comp(*a)
                val = float(jax.device_get(val)); times.append(time.perf_counter() - t4)
                a = (a[0], st.work) + a[2:]
            PR._keep_workspace(st.work)
            v["runs"] = times; v["value"] = val; v["need"] = int(st.need)
            r["variants"][vname] = v
            print("  ", vname, {k: (round(x, 4) if isinstance(x, float) else x) for k, x in v.items() if k != "top"}, flush=True)
            if prof:
                for row in v["top"][:50]:
                    print("     ", row)
        res[name] = r
    json.dump(res, open(os.path.join(OUT, f"compile_{TAG}.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
