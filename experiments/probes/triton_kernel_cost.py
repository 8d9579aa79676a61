"""What each fused Pallas kernel costs Triton to compile, measured on a machine without a GPU.

The GPU program (propagate's tiled engine with the fused kernels, as gpu_compile_parts.py builds it) is
lowered here for CUDA (`lowering_platforms=("cuda",)`, no device needed). Each Triton call's IR is read
back with jaxlib's MLIR bindings, canonicalized as Triton's own TTIR stage does, and compiled for sm_90 by
the pip `triton` package in another interpreter (TRITON_PYTHON; `python -m venv V && V/bin/pip install
triton`), through ptxas to a cubin. Recorded per kernel: seconds, TTIR ops, loads, stores, PTX bytes; per
case their sum and largest. XLA compiles the same IR with its own copy of Triton: the seconds here are a
proxy on this CPU, for comparing kernel code, not the H100 host's figures (gpu_compile_parts.py is).

    TRITON_PYTHON=/tmp/tv/bin/python SRC=<tree holding pauliprop> FUSED='{"NUM_WARPS": 8}' TAG=w8 \\
        python experiments/probes/triton_kernel_cost.py --out experiments/results/triton_kernel_cost_DATE.json
"""
import argparse, json, os, platform, re, subprocess, sys, tempfile, time

SRC = os.environ.get("SRC")
if SRC:
    sys.path.insert(0, SRC)
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # probes/, experiments/
import jax

jax.config.update("jax_enable_x64", True)
import numpy as np
from jax._src.lib import triton as jax_triton
from jax._src.lib.mlir import ir

from pauliprop.propagation import fused, tiled
from pauliprop.propagation import propagate as PR
from gpu_compile_parts import case_circuit  # its import also sets the kernels' constants from FUSED

COMPILE = r'''
import json, os, sys, time, warnings
os.environ["TRITON_ALWAYS_COMPILE"] = "1"; os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
warnings.filterwarnings("ignore")
import triton
import triton.compiler as tc
from triton._C.libtriton import ir
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
target = GPUTarget("cuda", 90, 32); backend = CUDABackend(target)
rows = []
for n, path in enumerate([min(sys.argv[2:], key=os.path.getsize)] + sys.argv[2:]):
    ctx = ir.context(); ir.load_dialects(ctx); backend.load_dialects(ctx)
    mod = ir.parse_mlir_module(path, ctx); mod.context = ctx
    CUDABackend.make_ttir(mod, {}, None, 90)  # the canonical TTIR Triton itself would compile from
    text = str(mod); canon = path[:-5] + ".canonical.ttir"
    open(canon, "w").write(text)
    t0 = time.perf_counter()
    k = tc.compile(canon, target=target, options={"num_warps": int(sys.argv[1]), "num_stages": 1})
    if n == 0:
        continue  # the first compile of a process pays Triton's own start (about 0.3 s here): a warm-up
    rows.append(dict(seconds=round(time.perf_counter() - t0, 4), ttir_ops=text.count(" = "), loads=text.count("tt.load"),
                     stores=text.count("tt.store"), ptx_bytes=len(k.asm["ptx"])))
print(json.dumps(dict(triton=triton.__version__, rows=rows)))
'''


def unescape(s: str) -> bytes:
    """An MLIR string attribute's bytes (\\XX hex escapes)."""
    out, i = bytearray(), 0
    while i < len(s):
        if s[i] == "\\":
            c = s[i + 1]
            if c in '\\"nt':
                out.append({"\\": 92, '"': 34, "n": 10, "t": 9}[c]); i += 2
            else:
                out.append(int(s[i + 1:i + 3], 16)); i += 3
        else:
            out.append(ord(s[i])); i += 1
    return bytes(out)


def kernels(name: str, folder: str):
    """The case's GPU program lowered for CUDA: (trace s, lower s, [(kernel name, TTIR file)])."""
    circuit, obs, trunc = case_circuit(name)
    low = PR.lowered(circuit, trunc, "gpu", layers=True, support=PR.observable_support(obs))
    cap = 1 << 22
    cfg = PR.tiled_config(low, trunc, cap, "gpu")
    lanes = obs.num_lanes
    words, coeffs, _ = tiled.host_merge(obs.x, obs.z, obs.coeffs, trunc)
    ow = np.zeros((64, 2 * lanes), np.uint32); ow[:len(words)] = words
    oc = np.zeros(64); oc[:len(words)] = coeffs
    args = (low.tables, PR._work_shape(cap, lanes, "float64"), ow, oc, np.int32(len(words)), np.int32(1), np.int32(0),
            np.bool_(True), np.zeros(max(circuit.num_params, 1)), trunc.limits(np.float64),
            PR.state_table("0", circuit.num_qubits, lanes))
    t0 = time.perf_counter(); traced = PR._tiled_jit(cfg, "gpu").trace(*args)
    t1 = time.perf_counter(); text = traced.lower(lowering_platforms=("cuda",)).as_text()
    t2 = time.perf_counter()
    found = []
    for j, m in enumerate(re.finditer(r"stablehlo.custom_call @__gpu\$xla\.gpu\.triton.*", text)):
        line = m.group(0)
        kernel = re.search(r'name = "([^"]*)"', line).group(1)
        with ir.Context() as ctx:
            jax_triton.dialect.register_dialect(ctx)
            ctx.allow_unregistered_dialects = True
            ttir = str(ir.Module.parse(unescape(re.search(r'ir = "((?:[^"\\]|\\.)*)"', line).group(1))))
        path = os.path.join(folder, f"{name}_{j:02d}.ttir")
        open(path, "w").write(ttir)
        found.append((kernel, path))
    return t1 - t0, t2 - t1, found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="ki,ising8")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tag, warps = os.environ.get("TAG", "x"), fused.NUM_WARPS
    python = os.environ.get("TRITON_PYTHON", sys.executable)
    result = dict(benchmark="triton_kernel_cost", tag=tag, src=SRC or ".", fused=dict(BLOCK=fused.BLOCK, NUM_WARPS=warps),
                  host=platform.processor() or platform.machine(), cpus=os.cpu_count(),
                  date=time.strftime("%Y-%m-%d"), jax=jax.__version__, cases={})
    with tempfile.TemporaryDirectory() as folder:
        for name in a.cases.split(","):
            trace, lower, found = kernels(name, folder)
            out = json.loads(subprocess.run([python, "-c", COMPILE, str(warps)] + [p for _, p in found],
                                            check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            rows = [dict(kernel=k, **r) for (k, _), r in zip(found, out["rows"])]
            result["triton"] = out["triton"]
            secs = [r["seconds"] for r in rows]
            result["cases"][name] = dict(trace_s=round(trace, 3), lower_s=round(lower, 3), kernels=rows,
                                         sum_s=round(sum(secs), 3), max_s=round(max(secs), 3))
            print(name, tag, "trace %.2f lower %.2f" % (trace, lower),
                  "kernels %d sum %.3f max %.3f" % (len(rows), sum(secs), max(secs)))
            for r in rows:
                print("   %-22s %.3f s  ops %4d  loads %3d  stores %3d  ptx %7d"
                      % (r["kernel"], r["seconds"], r["ttir_ops"], r["loads"], r["stores"], r["ptx_bytes"]))
    runs = json.load(open(a.out)) if os.path.exists(a.out) else []
    json.dump(runs + [result], open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
