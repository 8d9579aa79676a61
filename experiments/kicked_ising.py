"""IBM 127-qubit kicked Ising (Kim et al., Nature 618, 500 (2023)): pauliprop beside Qiskit's pauli-prop.

Circuit: start in |0>^127; per step RX(theta_h) on all 127 qubits, then RZZ(-pi/2) on the 144 heavy-hex
edges (`pauliprop.models.kicked_ising`); theta_h = k*pi/32.

Workloads
  z62   <Z62> after 20 steps. Both tools get the settings of pauli-prop's 127-qubit guide:
        keep the 1e5 largest terms and drop |coefficient| < 1e-5 (pauli-prop: max_terms, atol;
        ours: pp.Truncation(max_terms=..., min_abs_coeff=...)). Compared with the converged values of
        Begusic, Gray and Chan (arXiv:2308.05077): MIX and SPD, column 5b. No exact value exists.
  mz5   M_z = (1/127) sum_i Z_i after 5 steps, against the exact values (exact.csv, column 4a).
        Ours with a coefficient threshold (--mz-min-abs-coeff, optionally --mz-max-terms); pauli-prop
        with atol = the same threshold and max_terms = --mz-max-terms or --mz-peer-max-terms.
  check Both tools untruncated (pauli-prop: max_terms 1e7, atol 1e-14) for --check-steps steps on a sum of
        X/Y/Z words around qubit 62 (and the weight-10 word of column 4b): the values must agree to
        rounding. It checks that the two circuits, qubit orders and sign conventions are the same.

How pauli-prop is driven (its guide "Simulate a 127-qubit kicked-Ising model", verbatim API):
  op, trunc_1norm = pauli_prop.propagate_through_circuit(obs, qiskit_circuit, max_terms, atol, frame="h")
  value = op.coeffs[~op.paulis.x.any(axis=1)].sum().real       # <0|O'|0>: the diagonal (I/Z) terms
propagate_through_circuit calls evolve_through_cliffords itself (Clifford absorption), so its wall time
includes it. Qiskit does not list RZZ(-pi/2) as a Clifford gate name, so with the guide's circuit
(--peer-circuit rzz, default) the RZZ gates stay Pauli rotations of angle -pi/2 (cos ~ 6e-17, dropped
by atol); --peer-circuit cz writes each RZZ(-pi/2) as Sdg x Sdg then CZ (equal up to a global phase),
which pauli-prop absorbs. A Clifford permutes Pauli words, so both should truncate alike (up to ties
and to where the cos(-pi/2) debris counts against max_terms).

Timing: ours first runs as a user does, pp.expectation with no capacity (it starts at pauliprop's
default or --capacity and, on overflow, grows the buffer and resumes at the overflowing gate):
first_call_s (= search_s) is that whole first-time wall time, compilation included. Then timed
calls that start at the capacity it found (initial_capacity: the same program, no compile;
`seconds`; --repeats N: the best of N); compile_s = first_call_s - seconds. The jitted program takes the angles as data, so later angles
of the same workload reuse the compilation. pauli-prop: wall time of one propagate_through_circuit
call plus the diagonal sum (building the Qiskit circuit, build_circuit_s, is apart); --repeats N: the
best of N for it too.
All times are time.perf_counter around jax.block_until_ready / the peer's call.

Examples
  python experiments/kicked_ising.py                                   # z62 and mz5 at k = 4, 8, 12
  python experiments/kicked_ising.py --workloads z62 --angles 8 --steps 3   # quick run
  python experiments/kicked_ising.py --workloads check --check-steps 3 --peer-circuit both
  python experiments/kicked_ising.py --workloads z62 --angles all      # the guide's 17 angles
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO_ROOT))

import benchtools  # noqa: E402  (experiments/benchtools.py)
import pauliprop as pp  # noqa: E402
from pauliprop import models  # noqa: E402

NUM_QUBITS = 127
THETA_J = -math.pi / 2

WORKLOADS = {
    # name: observable, default steps, reference steps, reference columns (file, column), primary ref
    "z62": dict(desc="<Z62>", ref_steps=20, refs=(("mix", "mix.csv", "5b"), ("spd", "spd.csv", "5b")), primary="mix"),
    "mz5": dict(desc="M_z", ref_steps=5, refs=(("exact", "exact.csv", "4a"),), primary="exact"),
    # cross-check of the two circuits and conventions: both tools untruncated, a few steps, compare the values
    "check": dict(desc="mixed XYZ sum", ref_steps=None, refs=(), primary=None),
}

# the cross-check observable: X/Y/Z on several sites (sign conventions show), as (label, qubits, coeff)
CHECK_TERMS = [("Z", [62], 1.0), ("XY", [61, 62], 0.7), ("ZXZ", [61, 62, 72], -0.3), ("YY", [62, 63], 0.2),
               ("XXXYYZZZZZ", [13, 29, 31, 9, 30, 8, 12, 17, 28, 32], 0.5)]


# ---- references ------------------------------------------------------------------------------------

def load_references(data_dir: Path | None) -> tuple[dict, str]:
    """{workload: {ref name: {k: value}}} from the shared CSVs, or the constants in pauliprop.models."""
    refs = {w: {name: {} for name, _, _ in spec["refs"]} for w, spec in WORKLOADS.items()}
    if data_dir is not None and data_dir.is_dir():
        for w, spec in WORKLOADS.items():
            for name, fname, col in spec["refs"]:
                path = data_dir / fname
                if not path.exists():
                    continue
                with open(path, newline="") as f:
                    for row in csv.DictReader(f):
                        k = round(float(row["theta_h"]) / (math.pi / 32))
                        if row.get(col) not in (None, ""):
                            refs[w][name][k] = float(row[col])
        if any(refs[w][spec["primary"]] for w, spec in WORKLOADS.items() if spec["primary"]):
            return refs, str(data_dir)
    refs["z62"]["mix"] = dict(models.MIX_Z62_20_STEPS)
    refs["mz5"]["exact"] = dict(models.EXACT_MZ_5_STEPS)
    return refs, "pauliprop.models constants (EXACT_MZ_5_STEPS, MIX_Z62_20_STEPS)"


# ---- environment -----------------------------------------------------------------------------------

def environment() -> dict:
    env = benchtools.environment(("pauli-prop", "qiskit", "qiskit-aer"))
    env["pauliprop"] = getattr(pp, "__version__", None)
    return env


# ---- the two tools ---------------------------------------------------------------------------------

def observable(workload: str) -> pp.PauliSum:
    if workload == "check":
        return pp.PauliSum.from_list(CHECK_TERMS, NUM_QUBITS)
    return models.single_z(62, NUM_QUBITS) if workload == "z62" else models.magnetization(NUM_QUBITS)


def run_ours(workload, steps, k, trunc: pp.Truncation, repeats: int, capacity: int | None = None,
             max_capacity: int = 1 << 26) -> dict:
    """First call as a user makes it (`pp.expectation` with no capacity unless --capacity: it grows
    the buffer and resumes where it overflowed; compiles included): first_call_s. Then timed calls
    starting at the capacity it found (`initial_capacity`: the same program, nothing compiled):
    seconds (best of repeats), compile_s = first_call_s - seconds."""
    theta = k * math.pi / 32
    circuit = models.kicked_ising(steps, theta)
    obs = observable(workload)

    def call(cap, initial=None):
        t0 = time.perf_counter()
        val, stats = pp.expectation(circuit, obs, truncation=trunc, capacity=cap, return_stats=True,
                                    initial_capacity=initial)
        val = jax.block_until_ready(val)
        return float(val), stats, time.perf_counter() - t0

    val, stats, first = call(None, int(capacity) if capacity else None)
    cap = int(stats.capacity)
    times = []
    for _ in range(max(1, repeats)):
        val, stats, t = call(None, cap)
        times.append(t)
    run = min(times)
    d = dict(zip(("max_weight", "min_abs_coeff", "max_sins", "max_terms", "overflow"),
                 np.asarray(stats.dropped_norm).tolist()))
    return dict(value=val, seconds=run, seconds_all=times, first_call_s=first, compile_s=max(0.0, first - run),
                search_s=first, peak_terms=int(stats.max_terms_seen),
                final_terms=int(stats.terms[0]) if len(stats.terms) else None,
                dropped_norm=float(stats.total_dropped_norm), dropped_by_rule=d, overflow=bool(stats.overflow),
                capacity=cap, settings=dict(max_terms=trunc.max_terms, min_abs_coeff=trunc.min_abs_coeff,
                                            max_weight=trunc.max_weight, max_sins=trunc.max_sins))


def run_ours_batch(workload, steps, ks, trunc: pp.Truncation, repeats: int) -> dict:
    """The angles as one batch, as a sweep is meant to run: `pp.expectation(circuit, obs, params=(B, 1))`
    with theta_h a Param (one program for all). On CPUs its members run side by side on the cores
    (pauliprop.propagation.propagate._drive_side_by_side). batch_first_call_s: the first call, compilation
    included; batch_seconds: later calls (best of repeats). Returns {k: value} and the times."""
    circuit, obs = models.kicked_ising(steps, pp.Param(0)), observable(workload)
    angles = np.array([[k * math.pi / 32] for k in ks])

    def call():
        t0 = time.perf_counter()
        vals, stats = pp.expectation(circuit, obs, angles, truncation=trunc, return_stats=True)
        return np.asarray(jax.block_until_ready(vals)), stats, time.perf_counter() - t0

    vals, stats, first = call()
    times = [call()[2] for _ in range(max(1, repeats))]
    return dict(values={k: float(v) for k, v in zip(ks, vals)}, batch_first_call_s=first, batch_seconds=min(times),
                batch_seconds_all=times, batch_angles=list(ks), capacity=int(stats.capacity),
                overflow=bool(np.any(np.asarray(stats.overflow))))


def qiskit_circuit(steps: int, theta: float, mode: str):
    """The same circuit in Qiskit (qubit i = our qubit i). mode 'rzz': as in pauli-prop's guide;
    'cz': RZZ(-pi/2) = e^{i pi/4} CZ (Sdg x Sdg), Clifford gates pauli-prop recognizes and absorbs."""
    from qiskit import QuantumCircuit

    edges = models.heavy_hex_127()
    qc = QuantumCircuit(NUM_QUBITS)
    for _ in range(steps):
        qc.rx(theta, range(NUM_QUBITS))
        for a, b in edges:
            if mode == "rzz":
                qc.rzz(THETA_J, a, b)
            else:
                qc.sdg(a)
                qc.sdg(b)
                qc.cz(a, b)
    return qc


def qiskit_observable(workload: str):
    from qiskit.quantum_info import SparsePauliOp

    if workload == "check":
        return SparsePauliOp.from_sparse_list(CHECK_TERMS, NUM_QUBITS)  # Qiskit's sparse list: same qubit order
    if workload == "z62":
        return SparsePauliOp.from_sparse_list([("Z", [62], 1.0)], NUM_QUBITS)
    return SparsePauliOp.from_sparse_list([("Z", [q], 1.0 / NUM_QUBITS) for q in range(NUM_QUBITS)], NUM_QUBITS)


def run_peer(workload, steps, k, max_terms: int, atol: float, mode: str, repeats: int = 1) -> dict:
    from pauli_prop import propagate_through_circuit

    theta = k * math.pi / 32
    t0 = time.perf_counter()
    qc = qiskit_circuit(steps, theta, mode)
    obs = qiskit_observable(workload)
    build = time.perf_counter() - t0
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        op, trunc_1norm = propagate_through_circuit(obs, qc, int(max_terms), float(atol), frame="h")
        val = float(np.real(op.coeffs[~op.paulis.x.any(axis=1)].sum()))
        times.append(time.perf_counter() - t0)
    return dict(value=val, seconds=min(times), seconds_all=times, build_circuit_s=build, peak_terms=None,
                final_terms=len(op),
                dropped_norm=float(trunc_1norm), settings=dict(max_terms=int(max_terms), atol=float(atol), circuit=mode))


# ---- driver ----------------------------------------------------------------------------------------

def parse_angles(text: str) -> list[int]:
    if text.strip().lower() == "all":
        return list(range(17))
    return [int(s) for s in text.replace(" ", "").split(",") if s]


def default_out(backend: str) -> Path:
    return benchtools.default_out("kicked_ising", backend)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--workloads", default="z62,mz5", help="comma list of z62, mz5, check (default: z62,mz5); "
                    "check: both tools untruncated for --check-steps steps on a mixed observable")
    ap.add_argument("--angles", default="4,8,12", help="k values, theta_h = k*pi/32, comma list or 'all' (0..16)")
    ap.add_argument("--steps", type=int, default=20, help="Trotter steps of z62 (default 20; references need 20)")
    ap.add_argument("--mz-steps", type=int, default=5, help="Trotter steps of mz5 (default 5; references need 5)")
    ap.add_argument("--check-steps", type=int, default=3, help="steps of the check workload (3)")
    ap.add_argument("--max-terms", type=float, default=1e5, help="z62, both tools: keep the N largest terms (1e5)")
    ap.add_argument("--min-abs-coeff", type=float, default=1e-5, help="z62, both tools: drop |c| < this (1e-5; "
                    "pauli-prop's atol)")
    ap.add_argument("--mz-min-abs-coeff", type=float, default=1e-5, help="mz5, both tools: drop |c| < this (1e-5)")
    ap.add_argument("--mz-max-terms", type=float, default=None, help="mz5, both tools: keep the N largest terms "
                    "(default: off for ours)")
    ap.add_argument("--mz-peer-max-terms", type=float, default=1e7, help="mz5, pauli-prop's max_terms when "
                    "--mz-max-terms is off (it needs one; it preallocates for it) (1e7)")
    ap.add_argument("--peer-circuit", default="rzz", choices=("rzz", "cz", "both"),
                    help="how pauli-prop gets the RZZ(-pi/2) gates: 'rzz' (its guide), 'cz' (Clifford gates it "
                    "absorbs), or both")
    ap.add_argument("--capacity", type=float, default=None, help="ours, z62/check: first term-buffer capacity, "
                    "doubled and re-run (a new compile) while it overflows (default: pauliprop's own choice, "
                    "max_terms rounded up to a power of two)")
    ap.add_argument("--mz-capacity", type=float, default=None, help="ours, mz5: first capacity (default: "
                    "pauliprop's, 8192, then doubling; 2**21 skips the search at k <= 8, k = 12 needs 2**22)")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls of each tool (ours after its compile "
                    "call); the best is reported, all are recorded")
    ap.add_argument("--batch", action="store_true", help="ours: the angles of a workload as one batched call "
                    "(first, before the peer), recorded as tool 'pauliprop-batch'; the per-angle calls still run "
                    "unless --skip-ours")
    ap.add_argument("--skip-peer", action="store_true", help="do not run pauli-prop")
    ap.add_argument("--skip-ours", action="store_true", help="do not run pauliprop")
    ap.add_argument("--data", type=Path, default=REPO_ROOT.parent / "shared" / "data" / "kicked_ising",
                    help="reference CSV folder (default ../shared/data/kicked_ising from the repo root)")
    ap.add_argument("--out", type=Path, default=None, help="JSON output (default experiments/results/"
                    "kicked_ising_<backend>_<date>.json)")
    args = ap.parse_args(argv)

    workloads = [w for w in args.workloads.replace(" ", "").split(",") if w]
    for w in workloads:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    angles = parse_angles(args.angles)
    peer_modes = ["rzz", "cz"] if args.peer_circuit == "both" else [args.peer_circuit]

    env = environment()
    refs, ref_source = load_references(args.data)
    if args.skip_peer:
        peer_status = "skipped (--skip-peer)"
    else:
        try:
            import pauli_prop  # noqa: F401
            peer_status = "ok"
        except Exception as e:  # missing wheel, or a broken install (qiskit-aer)
            peer_status = f"not installed ({type(e).__name__}: {e})"
    out = args.out or default_out(env["jax_backend"])
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(env, references=ref_source, peer_status={"pauli-prop": peer_status},
                args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                circuit="per step: RX(theta_h) on 127 qubits, RZZ(-pi/2) on the 144 heavy-hex edges; |0...0>",
                note="ours: first_call_s = the first call as a user makes it (compiles, capacity growth and resumed "
                     "runs included); seconds = a later call starting at the capacity found (the same program); "
                     "compile_s = first_call_s - seconds; "
                     "pauli-prop: wall time of propagate_through_circuit (Clifford absorption included)")
    records = []

    def save():
        tmp = out.with_suffix(".json.tmp")
        with open(tmp, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)
        os.replace(tmp, out)

    print(f"# {env['date_utc']} {env['hostname']}: {env['cpu_model']} ({env['cpu_count']} cpus, load "
          f"{env['load_average_1_5_15']}), jax {env['versions']['jax']} on {env['jax_backend']} "
          f"({env['device_kind']}), pauli-prop {env['versions']['pauli-prop']}: {peer_status}", flush=True)
    print(f"# references: {ref_source}; writing {out}", flush=True)

    for w in workloads:
        spec = WORKLOADS[w]
        steps = {"z62": args.steps, "mz5": args.mz_steps, "check": args.check_steps}[w]
        if w == "check":  # untruncated; pauli-prop needs a max_terms, and an atol below the RZZ cos(-pi/2) debris
            max_terms, thr, peer_max_terms, peer_atol = None, None, 10**7, 1e-14
        elif w == "z62":
            max_terms, thr = int(args.max_terms), args.min_abs_coeff
            peer_max_terms = max_terms
        else:
            max_terms = int(args.mz_max_terms) if args.mz_max_terms else None
            thr = args.mz_min_abs_coeff
            peer_max_terms = max_terms or int(args.mz_peer_max_terms)
        if w != "check":
            peer_atol = thr
        trunc = pp.Truncation(max_terms=max_terms, min_abs_coeff=thr)
        cap = args.mz_capacity if w == "mz5" else args.capacity
        capacity = int(cap) if cap else None
        batch = None
        if args.batch:
            try:
                batch = run_ours_batch(w, steps, angles, trunc, args.repeats)
                print(f"# pauliprop-batch: {len(angles)} angles, first call {batch['batch_first_call_s']:.2f} s, "
                      f"later {batch['batch_seconds']:.2f} s", flush=True)
            except Exception as e:
                batch = f"error: {type(e).__name__}: {e}"  # recorded as each angle's status
                traceback.print_exc()
        for k in angles:
            ref_vals = {name: (refs[w][name].get(k) if steps == spec["ref_steps"] else None) for name, _, _ in spec["refs"]}
            base = dict(workload=w, observable=spec["desc"], steps=steps, k=k, theta_h=k * math.pi / 32,
                        reference=ref_vals, reference_primary=spec["primary"])
            jobs = []
            if batch is not None:  # this angle's share of the batch that already ran
                jobs.append(("pauliprop-batch", batch if isinstance(batch, str) else lambda: dict(
                    {n: v for n, v in batch.items() if n != "values"}, value=batch["values"][k])))
            if not args.skip_ours:
                jobs.append(("pauliprop", lambda: run_ours(w, steps, k, trunc, args.repeats, capacity)))
            for mode in peer_modes:
                name = "pauli-prop" if mode == "rzz" else f"pauli-prop[{mode}]"
                if peer_status != "ok":
                    jobs.append((name, peer_status))
                else:
                    jobs.append((name, lambda mode=mode: run_peer(w, steps, k, peer_max_terms, peer_atol, mode,
                                                                  args.repeats)))
            for tool, job in jobs:
                rec = dict(base, tool=tool)
                if isinstance(job, str):
                    rec.update(status=job, value=None)
                else:
                    try:
                        rec.update(job(), status="ok")
                        if rec.get("overflow"):
                            rec["status"] = "ok, but the capacity overflowed (terms lost: see dropped_by_rule)"
                    except Exception as e:
                        rec.update(status=f"error: {type(e).__name__}: {e}", value=None)
                        traceback.print_exc()
                v = rec.get("value")
                rec["abs_error"] = {n: (abs(v - r) if v is not None and r is not None else None) for n, r in ref_vals.items()}
                rec["abs_error_primary"] = rec["abs_error"].get(spec["primary"])
                ours = next((r for r in records[::-1] if r["tool"] == "pauliprop" and r["workload"] == w
                             and r["k"] == k and r["steps"] == steps and r.get("value") is not None), None)
                if tool != "pauliprop" and v is not None and ours is not None:
                    rec["delta_vs_pauliprop"] = v - ours["value"]
                records.append(rec)
                save()
                print(_line(rec), flush=True)

    print()
    print(table(records, workloads))
    print(f"\nwrote {out}")
    return records


def _fmt(x, spec):
    if x is None:
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return "-".rjust(int(width) if width else 1)
    return format(x, spec)


HEADER = (f"{'tool':<19} {'wl':<4} {'st':>3} {'k':>3} {'value':>10} {'ref':>10} {'|err|':>9} "
          f"{'vs ours':>9} {'sec':>8} {'compile':>8} {'search':>8} {'peak':>8} {'final':>8} {'dropped':>9}  status")


def _line(r):
    ref = r["reference"].get(r["reference_primary"]) if r["reference_primary"] else None
    return (f"{r['tool']:<19} {r['workload']:<4} {r['steps']:>3} {r['k']:>3} {_fmt(r.get('value'), '10.6f')} "
            f"{_fmt(ref, '10.6f')} {_fmt(r.get('abs_error_primary'), '9.2e')} {_fmt(r.get('delta_vs_pauliprop'), '9.2e')} "
            f"{_fmt(r.get('seconds'), '8.2f')} "
            f"{_fmt(r.get('compile_s'), '8.2f')} {_fmt(r.get('search_s'), '8.2f')} {_fmt(r.get('peak_terms'), '8d')} {_fmt(r.get('final_terms'), '8d')} "
            f"{_fmt(r.get('dropped_norm'), '9.3g')}  {r['status']}")


def table(records, workloads) -> str:
    lines = [HEADER, "-" * len(HEADER)]
    for w in workloads:
        rs = [r for r in records if r["workload"] == w]
        lines += [_line(r) for r in rs]
        for tool in dict.fromkeys(r["tool"] for r in rs):
            ok = [r for r in rs if r["tool"] == tool and r["status"].startswith("ok")]
            if ok and tool == "pauliprop-batch":
                lines.append(f"  {w} {tool}: {len(ok)} angle(s) in one call, {ok[0]['batch_first_call_s']:.2f} s the "
                             f"first (compiles included), {ok[0]['batch_seconds']:.2f} s later")
            elif ok:
                errs = [r["abs_error_primary"] for r in ok if r["abs_error_primary"] is not None]
                deltas = [abs(r["delta_vs_pauliprop"]) for r in ok if r.get("delta_vs_pauliprop") is not None]
                first = [r["first_call_s"] for r in ok if r.get("first_call_s") is not None]
                lines.append(f"  {w} {tool}: {len(ok)} angle(s), total {sum(r['seconds'] for r in ok):.2f} s"
                             + (f" warm, {sum(first):.2f} s first calls (compiles included)" if first else "")
                             + (f", max |err| vs {ok[0]['reference_primary']} {max(errs):.3g}" if errs else "")
                             + (f", max |value - ours| {max(deltas):.3g}" if deltas else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
