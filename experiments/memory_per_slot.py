"""Bytes per buffer slot of the propagation loop's program, as XLA's memory analysis counts them.

The loop's program for the 127-qubit kicked Ising (Z62, 20 steps, min_abs_coeff 1e-4, max_weight 8)
is lowered and compiled at each capacity, with rotations one by one (SPLIT units: CPUs) and as layers
(LAYER units: GPUs), on this machine's backend; nothing runs. Per slot: the arguments (the term
buffer is 8 W + 12 bytes: words, coefficient, meta), the outputs (donated: aliased to the arguments),
and XLA's temporaries (every scratch array live at the peak of its buffer assignment). Issue 20's
target is 120 bytes a slot in all, in float64.

    python experiments/memory_per_slot.py --capacities 14,16,18
    python experiments/memory_per_slot.py --capacities 20,22 --truncation max_terms
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
import numpy as np  # noqa: E402

import benchtools  # noqa: E402
import pauliprop as pp  # noqa: E402
from pauliprop import models  # noqa: E402

PR = sys.modules["pauliprop.propagate"]  # `pauliprop.propagate` the attribute is the function


TRUNCATIONS = {  # name: the truncation at a capacity
    "ppjl": lambda capacity: pp.Truncation(min_abs_coeff=1e-4, max_weight=8),
    "max_terms": lambda capacity: pp.Truncation(max_terms=3 * capacity // 4, min_abs_coeff=1e-9),  # terms_at_scale.py
}


def analyse(layers: bool, capacity: int, truncation: str = "ppjl") -> dict:
    trunc = TRUNCATIONS[truncation](capacity)
    circuit, obs = models.kicked_ising(20, pp.Param(0)), models.single_z(62)
    backend = jax.default_backend()
    low = PR.lowered(circuit, trunc, backend, layers=layers)
    cfg = PR._config(low, trunc, capacity, True, backend, merged=True)
    args = (low.device_tables(backend), PR._initial_buffer(obs, capacity, jnp.float64), np.int32(1),
            PR._params_array(np.array([0.3]), circuit.num_params, jnp.float64), trunc.limits(jnp.float64),
            PR._state_table("0", circuit.num_qubits, obs.num_lanes))
    t0 = time.perf_counter()
    compiled = PR._forward_jit(cfg, False, backend).lower(*args).compile()
    m = compiled.memory_analysis()
    per = lambda b: b / capacity
    return dict(units="layers" if layers else "rotations one by one", capacity=capacity,
                compile_s=time.perf_counter() - t0, buffer_bytes_per_slot=8 * obs.num_lanes + 12,
                temp_per_slot=per(m.temp_size_in_bytes), argument_per_slot=per(m.argument_size_in_bytes),
                output_per_slot=per(m.output_size_in_bytes), alias_per_slot=per(m.alias_size_in_bytes),
                total_per_slot=per(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
                                   - m.alias_size_in_bytes))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", default="14,16,18", help="log2 of the capacities, comma separated")
    ap.add_argument("--truncation", choices=sorted(TRUNCATIONS), default="ppjl",
                    help="ppjl: min_abs_coeff 1e-4, max_weight 8 (rotations one by one and as layers); max_terms: "
                    "3/4 of the capacity and 1e-9 per gate (terms_at_scale.py's; rotations one by one only)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = []
    for layers in (False, True) if args.truncation == "ppjl" else (False,):
        for log2 in map(int, args.capacities.split(",")):
            rows.append(analyse(layers, 1 << log2, args.truncation) | {"truncation": args.truncation})
            print({k: round(v, 1) if isinstance(v, float) else v for k, v in rows[-1].items()}, flush=True)
    result = {"benchmark": "memory_per_slot", "environment": benchtools.environment(()), "git": benchtools.git_state(),
              "settings": vars(args) | {"out": str(args.out)}, "rows": rows}
    benchtools.write_result(result, args.out, "memory_per_slot", jax.default_backend())


if __name__ == "__main__":
    main()
