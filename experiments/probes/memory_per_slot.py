"""Bytes per buffer slot of the propagation loop's program, as XLA's memory analysis counts them.

The loop's program for the 127-qubit kicked Ising (Z62, 20 steps, min_abs_coeff 1e-4, max_weight 8)
is lowered and compiled at each capacity, with rotations one by one (SPLIT units: CPUs) and as layers
(LAYER units: GPUs), on this machine's backend; nothing runs. Per slot: the arguments (the term
buffer is 8 W + 12 bytes: words, coefficient, meta), the outputs (donated: aliased to the arguments),
and XLA's temporaries (every scratch array live at the peak of its buffer assignment). Issue 20's
target is 120 bytes a slot in all, in float64.

    python experiments/probes/memory_per_slot.py --capacities 14,16,18
    python experiments/probes/memory_per_slot.py --capacities 20,22 --truncation max_terms
    python experiments/probes/memory_per_slot.py --capacities 16 --truncation max_terms --breakdown

--breakdown also lists, from XLA's dump of the program's buffer assignment (hlo_memory.py), the arrays
live together at its memory peak and the places of its temporary allocation, each with its shape, bytes
a slot and the source lines that made it (--keep-dump DIR keeps XLA's text files).
"""

from __future__ import annotations

import argparse
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]  # probes/, experiments/

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import benchtools  # noqa: E402
import hlo_memory  # noqa: E402
import pauliprop as pp  # noqa: E402
from pauliprop import models  # noqa: E402
from pauliprop.propagation import propagate as PR  # noqa: E402


TRUNCATIONS = {  # name: the truncation at a capacity
    "ppjl": lambda capacity: pp.Truncation(min_abs_coeff=1e-4, max_weight=8),
    "max_terms": lambda capacity: pp.Truncation(max_terms=3 * capacity // 4, min_abs_coeff=1e-9),  # terms_at_scale.py
}


def analyse(layers: bool, capacity: int, truncation: str = "ppjl", breakdown: bool = False, keep_dump=None) -> dict:
    trunc = TRUNCATIONS[truncation](capacity)
    circuit, obs = models.kicked_ising(20, pp.Param(0)), models.single_z(62)
    backend = jax.default_backend()
    low = PR.lowered(circuit, trunc, backend, layers=layers)
    cfg = PR.config(low, trunc, capacity, True, backend, merged=True)
    args = (low.device_tables(backend), PR._initial_buffer(obs, capacity, jnp.float64), np.int32(1),
            PR.params_array(np.array([0.3]), circuit.num_params, jnp.float64), trunc.limits(jnp.float64),
            PR.state_table("0", circuit.num_qubits, obs.num_lanes))
    with tempfile.TemporaryDirectory() as dump:
        t0 = time.perf_counter()
        compiled = PR._forward_jit(cfg, False, backend).lower(*args).compile(
            hlo_memory.dump_options(dump) if breakdown else None)
        seconds = time.perf_counter() - t0
        views = dict(peak=hlo_memory.peak_values(dump, capacity),
                     placement=hlo_memory.temp_placement(dump, capacity)) if breakdown else {}
        if breakdown and keep_dump:  # the text files (XLA also writes machine code there)
            Path(keep_dump).mkdir(parents=True, exist_ok=True)
            name = f"xla_{'layers' if layers else 'rotations'}_{truncation}_{capacity.bit_length() - 1}.tar.gz"
            with tarfile.open(Path(keep_dump) / name, "w:gz") as tar:
                for f in Path(dump).glob("*.txt"):
                    tar.add(f, f.name)
    m = compiled.memory_analysis()
    per = lambda b: b / capacity
    return dict(units="layers" if layers else "rotations one by one", capacity=capacity,
                compile_s=seconds, buffer_bytes_per_slot=8 * obs.num_lanes + 12,
                temp_per_slot=per(m.temp_size_in_bytes), argument_per_slot=per(m.argument_size_in_bytes),
                output_per_slot=per(m.output_size_in_bytes), alias_per_slot=per(m.alias_size_in_bytes),
                total_per_slot=per(m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
                                   - m.alias_size_in_bytes), **views)


def show(row: dict) -> None:
    """The breakdown's largest arrays: live together at the peak, then as placed in the temporaries."""
    line = lambda r, extra="": print(f"  {r['bytes_per_slot']:6.1f} B {extra}{r['shape']:<18} {r['op'][:28]:<28} "
                                     f"{' < '.join(r['source'][:3])}")
    peak, place = row["peak"], row["placement"]
    print(f" live together at the peak ({peak['peak_per_slot']:.1f} B a slot, arguments included):")
    for r in peak["values"][:25]:
        line(r)
    print(f" placed in the temporary allocation ({place['temp_allocation_per_slot']:.1f} B a slot; the places "
          f"listed cover {place.get('covered_per_slot', 0):.1f}), largest first:")
    for r in place["places"][:25]:
        line(r, f"at {r['offset_per_slot']:6.1f} x{r['sharing']:<3} ")
    sys.stdout.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", default="14,16,18", help="log2 of the capacities, comma separated")
    ap.add_argument("--truncation", choices=sorted(TRUNCATIONS), default="ppjl",
                    help="ppjl: min_abs_coeff 1e-4, max_weight 8 (rotations one by one and as layers); max_terms: "
                    "3/4 of the capacity and 1e-9 per gate (terms_at_scale.py's; rotations one by one only)")
    ap.add_argument("--breakdown", action="store_true", help="list the arrays live at the memory peak "
                    "(hlo_memory.py; written as memory_breakdown_<backend>_<date>.json)")
    ap.add_argument("--keep-dump", type=Path, default=None,
                    help="with --breakdown: save XLA's text dumps of each program there (a .tar.gz each)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.breakdown:  # a program from the persistent compilation cache is not compiled, so XLA dumps nothing
        jax.config.update("jax_enable_compilation_cache", False)
    rows = []
    for layers in (False, True) if args.truncation == "ppjl" else (False,):
        for log2 in map(int, args.capacities.split(",")):
            rows.append(analyse(layers, 1 << log2, args.truncation, args.breakdown, args.keep_dump)
                        | {"truncation": args.truncation})
            print({k: round(v, 1) if isinstance(v, float) else v for k, v in rows[-1].items()
                   if k not in ("peak", "placement")}, flush=True)
            if args.breakdown:
                show(rows[-1])
    result = {"benchmark": "memory_per_slot", "environment": benchtools.environment(()), "git": benchtools.git_state(),
              "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "rows": rows}
    name = "memory_breakdown" if args.breakdown else "memory_per_slot"
    benchtools.write_result(result, args.out, name, jax.default_backend())


if __name__ == "__main__":
    main()
