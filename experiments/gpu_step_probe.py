"""What one step of a device loop costs: XLA's sort by size and key type, and conditionals.

A `lax.scan` of --steps steps over a buffer of random uint64 keys; each body is one of the cases
below; the figure is the best of three calls divided by the steps (microseconds a step, the
loop's own cost included: see `elementwise`). Written for the Pauli engine's choices on GPUs: what
a rotation's sort costs at each room size, and what a `lax.switch` costs whether or not a branch
sorts (a branch that sorts cannot run in a command buffer: the GPU copies the index to the host).

    python experiments/gpu_step_probe.py --out experiments/results/gpu_step_probe_h100_<date>.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402

import benchtools  # noqa: E402


def mix(k, i):
    return (k * jnp.uint64(0x9E3779B97F4A7C15)) ^ (k >> 29) ^ i.astype(jnp.uint64)


def sort_cases():
    idx = lambda k: jnp.arange(k.shape[0], dtype=jnp.int32)
    hi = lambda k: (k >> 32).astype(jnp.uint32)
    return {
        "elementwise": lambda k, i: mix(k, i),
        "sort_u64_key": lambda k, i: mix(lax.sort(k), i),
        "sort_u64_key_i32_payload": lambda k, i: mix(k[lax.sort((k, idx(k)), num_keys=1)[1]], i),
        "sort_u32_key_i32_payload": lambda k, i: mix(k ^ lax.sort((hi(k), idx(k)), num_keys=1)[1].astype(jnp.uint64), i),
    }


def switch_cases():
    pick = lambda k, i: ((k[0] >> 7) + i.astype(jnp.uint64)) % 3

    def scatter(k):
        m = (k & 1) == 1
        return jnp.zeros_like(k).at[jnp.where(m, jnp.cumsum(m.astype(jnp.int32)) - 1, k.shape[0])].set(k, mode="drop")

    loop = lambda k: lax.fori_loop(0, 8, lambda j, k: k ^ (k >> 3), k)
    sort1k = lambda k: k.at[:1024].set(lax.sort(k[:1024]))
    return {
        "switch_of_elementwise_and_scatter": lambda k, i: mix(lax.switch(pick(k, i), [lambda k: k, lambda k: k * 3, scatter], k), i),
        "switch_with_a_loop_branch": lambda k, i: mix(lax.switch(pick(k, i), [lambda k: k, scatter, loop], k), i),
        "switch_with_a_sort_branch": lambda k, i: mix(lax.switch(pick(k, i), [lambda k: k, scatter, sort1k], k), i),
        "sort_then_sort_free_switch": lambda k, i: mix(lax.switch(pick(k, i), [lambda k: k, scatter, lambda k: k ^ 5], sort1k(k)), i),
    }


def per_step(body, n: int, steps: int) -> dict:
    keys = jax.random.bits(jax.random.PRNGKey(0), (n,), jnp.uint64)
    f = jax.jit(lambda k: lax.scan(lambda c, i: (body(c, i), None), k, jnp.arange(steps))[0])
    t = time.perf_counter()
    f(keys).block_until_ready()
    first = time.perf_counter() - t
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        f(keys).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return {"us_per_step": best / steps * 1e6, "first_call_s": first}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--sizes", default="512,1024,2048,4096,16384,65536")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for n in map(int, args.sizes.split(",")):
        for name, body in sort_cases().items():
            rows.append({"case": name, "size": n, **per_step(body, n, args.steps)})
            print(rows[-1], flush=True)
    for name, body in switch_cases().items():
        rows.append({"case": name, "size": 65536, **per_step(body, 65536, args.steps)})
        print(rows[-1], flush=True)
    result = {"benchmark": "gpu_step_probe", "environment": benchtools.environment(()),
              "git": benchtools.git_state(), "settings": vars(args) | {"out": str(args.out)}, "rows": rows}
    benchtools.write_result(result, args.out, "gpu_step_probe", jax.default_backend())


if __name__ == "__main__":
    main()
