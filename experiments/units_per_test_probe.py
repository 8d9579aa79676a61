"""How often the propagation loop should test its end on a GPU (engine.Config.units_per_test).

A GPU copies a while loop's predicate to the host at every step and waits for it; the loop can
instead apply several units per step (units past the end run as no-ops). This times the kicked
Ising's loop (Z62, 20 steps, 1e-4 / weight 8, 65,536 slots; the circuit's 2,561 units) with 1 and
16 units a step: compilation (no persistent cache) and the best of three warm calls, one angle
(pi/4) and the 17 angles as a batch. Writes `units_per_test_probe.json` under $OUT (or here).

    PAULIPROP_NO_CACHE=1 python experiments/units_per_test_probe.py
"""
import os, sys, time, math, json
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np, jax.numpy as jnp
import pauliprop as pp
from pauliprop import models
from pauliprop.propagation import engine as E
from pauliprop.propagation import propagate as P
cap = 65536
circ = models.kicked_ising(20, pp.Param(0)); obs = models.single_z(62)
tr = pp.Truncation(min_abs_coeff=1e-4, max_weight=8)
low = P.lowered(circ, tr, "gpu")
table = jnp.asarray(E.overlap_table("0", 127, 4))
T = low.device_tables("gpu")
limits = tr.limits(jnp.float64)
out = {}
for K in (1, 16):
    for batch in (None, 17):
        cfg = P.config(low, tr, cap, True, "gpu")._replace(units_per_test=K)
        fn = P._forward_jit(cfg, batch is not None, "gpu")
        p = np.array([[k * math.pi / 32] for k in range(17)]) if batch else np.array([8 * math.pi / 32])
        buf = P._initial_buffer(obs, cap, jnp.float64, batch)
        t = time.perf_counter(); lo = fn.lower(T, buf, np.int32(0), p, limits, table); t1 = time.perf_counter()
        ex = lo.compile(); t2 = time.perf_counter()
        best = 1e9
        for _ in range(3):
            buf = P._initial_buffer(obs, cap, jnp.float64, batch)
            t3 = time.perf_counter(); r = ex(T, buf, np.int32(0), p, limits, table); jax.block_until_ready(r); best = min(best, time.perf_counter() - t3)
        key = f"K{K}_{'batch17' if batch else 'single'}"
        out[key] = dict(trace_lower_s=t1 - t, compile_s=t2 - t1, warm_s=best, value=np.asarray(r[2]).tolist())
        print(key, {k: v for k, v in out[key].items() if k != "value"}, flush=True)
out["device"] = str(jax.devices()[0].device_kind)
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "units_per_test_probe.json"), "w"), indent=1)
