"""Can a Pallas (Triton) kernel fuse a diagonal's phases into a dense block's matrix product?

The fused state-vector executor spends a pass of its own on every diagonal block, because XLA does
not fuse an element-wise producer into cuBLAS's GEMM. A kernel of our own could apply the phases on
the way into the product. This probe asks the GPU what Pallas's Triton lowering can do towards it:
complex128 refs, float64 dots, in-kernel slicing, and the speed of such a kernel (planar real and
imaginary parts, phases as a per-column product over the block's row bits) against XLA's complex
GEMM over the same 2^28 amplitudes. On a CPU it runs in interpret mode, as a correctness check only.

    python experiments/pallas_f64_probe.py [--small] [--out FILE]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

import benchtools

jax.config.update("jax_enable_x64", True)
INTERPRET = jax.default_backend() == "cpu"
res: dict = {}


def attempt(name, f):
    try:
        res[name] = f()
    except Exception as e:
        res[name] = "FAIL " + type(e).__name__ + ": " + (str(e).splitlines() or [""])[0][:300]
    print(name, res[name], flush=True)

def complex_kernel():
    def k(x_ref, o_ref):
        o_ref[...] = x_ref[...] * (1 + 2j)
    x = jnp.arange(1024, dtype=jnp.complex128).reshape(8, 128)
    y = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET)(x)
    return float(jnp.abs(y - x * (1 + 2j)).max())

def f64_dot():
    def k(a_ref, b_ref, o_ref):
        o_ref[...] = jnp.dot(a_ref[...], b_ref[...])
    a = jnp.asarray(np.random.default_rng(0).standard_normal((64, 64)))
    b = jnp.asarray(np.random.default_rng(1).standard_normal((64, 128)))
    y = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float64), interpret=INTERPRET)(a, b)
    return float(jnp.abs(y - a @ b).max())

def reshape_slice():
    def k(x_ref, o_ref):
        x = x_ref[...].reshape(2, 32, 128)
        o_ref[...] = jnp.concatenate([x[1], x[0]], axis=0)
    x = jnp.arange(64 * 128, dtype=jnp.float64).reshape(64, 128)
    y = pl.pallas_call(k, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=INTERPRET)(x)
    want = jnp.concatenate([x[32:], x[:32]])
    return float(jnp.abs(y - want).max())

def fused(K=64, N=2**22, BN=128, repeats=5):
    """planar: out = M (x * f), f[k, n] = c(n) prod_s w_s(n)^{bit s of k}"""
    S = int(np.log2(K)); SP = 8
    def k(xr, xi, mr, mi, wr, wi, o_r, o_i):
        rows = jax.lax.broadcasted_iota(jnp.int32, (K, BN), 0)
        fr = jnp.ones((K, BN), jnp.float64)
        fi = jnp.zeros((K, BN), jnp.float64)
        for s in range(S):
            on = ((rows >> s) & 1) == 1
            a, b = wr[s, :][None, :], wi[s, :][None, :]
            nr, ni = fr * a - fi * b, fr * b + fi * a
            fr, fi = jnp.where(on, nr, fr), jnp.where(on, ni, fi)
        x_r, x_i = xr[...], xi[...]
        yr, yi = x_r * fr - x_i * fi, x_r * fi + x_i * fr
        m_r, m_i = mr[...], mi[...]
        o_r[...] = jnp.dot(m_r, yr) - jnp.dot(m_i, yi)
        o_i[...] = jnp.dot(m_r, yi) + jnp.dot(m_i, yr)
    rng = np.random.default_rng(0)
    xr = jnp.asarray(rng.standard_normal((K, N))); xi = jnp.asarray(rng.standard_normal((K, N)))
    m = rng.standard_normal((K, K)) + 1j * rng.standard_normal((K, K))
    w = np.exp(1j * rng.uniform(0, 6.3, (SP, N)))
    args = (xr, xi, jnp.asarray(m.real), jnp.asarray(m.imag), jnp.asarray(w.real), jnp.asarray(w.imag))
    spec_x = pl.BlockSpec((K, BN), lambda j: (0, j))
    spec_m = pl.BlockSpec((K, K), lambda j: (0, 0))
    spec_w = pl.BlockSpec((SP, BN), lambda j: (0, j))
    call = jax.jit(pl.pallas_call(k, grid=(N // BN,), in_specs=[spec_x, spec_x, spec_m, spec_m, spec_w, spec_w],
                                  out_specs=[spec_x, spec_x],
                                  out_shape=[jax.ShapeDtypeStruct((K, N), jnp.float64)] * 2, interpret=INTERPRET))
    t0 = time.perf_counter(); o = call(*args); jax.block_until_ready(o); compile_s = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter(); jax.block_until_ready(call(*args)); times.append(time.perf_counter() - t0)
    # check a few columns
    cols = np.arange(0, N, N // 64)
    bits = (np.arange(K)[:, None] >> np.arange(S)[None, :]) & 1
    f = np.prod(np.where(bits[:, :, None] == 1, w[None, :S, cols], 1), axis=1)
    x = (np.asarray(xr)[:, cols] + 1j * np.asarray(xi)[:, cols]) * f
    want = m @ x
    got = np.asarray(o[0])[:, cols] + 1j * np.asarray(o[1])[:, cols]
    # xla reference time: complex gemm in place + elementwise
    xc = jax.jit(lambda a, b: jax.lax.complex(a, b))(xr, xi); jax.block_until_ready(xc)
    mc = jnp.asarray(m)
    g = jax.jit(lambda x, m: jnp.dot(m, x, precision="highest"))
    jax.block_until_ready(g(xc, mc)); tg = []
    for _ in range(repeats):
        t0 = time.perf_counter(); jax.block_until_ready(g(xc, mc)); tg.append(time.perf_counter() - t0)
    return {"K": K, "BN": BN, "err": float(np.abs(got - want).max()), "compile_s": compile_s,
            "median_ms": 1e3 * float(np.median(times)), "xla_zgemm_ms": 1e3 * float(np.median(tg))}

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--small", action="store_true", help="a 2^14-amplitude kernel only (CPU interpret mode)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    res["environment"] = benchtools.environment(())
    attempt("complex_kernel", complex_kernel)
    attempt("f64_dot", f64_dot)
    attempt("reshape_slice", reshape_slice)
    if args.small:
        attempt("fused_small", lambda: fused(K=16, N=2**10, BN=128, repeats=1))
    else:
        for K, BN in [(64, 64), (64, 128), (32, 128), (128, 64)]:
            attempt(f"fused_K{K}_BN{BN}", lambda K=K, BN=BN: fused(K=K, N=2**28 // K, BN=BN))
    benchtools.write_result(res, args.out, "pallas_f64_probe", jax.default_backend())


if __name__ == "__main__":
    main()
