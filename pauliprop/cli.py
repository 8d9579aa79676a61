"""`pauliprop` command: the 127-qubit kicked Ising estimate beside the published reference, and
`pauliprop estimate` for a circuit file and an observable of your own.

Default (no subcommand): Z62 after 20 steps at theta_h = pi/8, pi/4, 3pi/8 (IBM's utility
experiment, Kim et al. 2023) with min_abs_coeff 1e-4 and max_weight 8, next to the MIX reference of
Begusic, Gray and Chan (arXiv:2308.05077). `--observable mz --steps 5` compares M_z with the exact
values instead.

    pauliprop estimate circuit.qasm --observable "Z0 Z1 + 0.5 X2" --min-abs-coeff 1e-4 [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from .runtime import devices


def _positive(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad command line reported in one line (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pauliprop", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="pauliprop estimate --help: a circuit file and an observable of your own")
    p.add_argument("--observable", choices=["z62", "mz"], default="z62", help="Z62 or M_z = mean of Z_i")
    p.add_argument("--steps", type=_positive, default=None, help="Trotter steps (default: 20 for z62, 5 for mz)")
    p.add_argument("--angles", type=int, nargs="+", default=[4, 8, 12], metavar="K",
                   help="theta_h = K*pi/32 (default: 4 8 12)")
    p.add_argument("--min-abs-coeff", type=float, default=1e-4)
    p.add_argument("--max-weight", type=int, default=8, help="0 switches the weight truncation off")
    p.add_argument("--max-terms", type=int, default=None)
    p.add_argument("--capacity", type=_positive, default=None, help="term buffer size (default: automatic)")
    p.add_argument("--float32", action="store_true", help="single precision coefficients")
    p.add_argument("--plot", metavar="PNG", default="pauliprop_kicked_ising.png",
                   help="where the plot of the estimates goes, with matplotlib installed (default: %(default)s)")
    p.add_argument("--no-plot", action="store_true", help="no plot")
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["estimate"]:
        return estimate(argv[1:])
    return demo(argv)


def demo(argv) -> int:
    args = _parser().parse_args(argv)
    try:
        return _demo(args)
    except (ValueError, TypeError, OSError, MemoryError) as exc:
        print(f"pauliprop: error: {exc}", file=sys.stderr)
        return 1


def _demo(args) -> int:
    import jax

    jax.config.update("jax_enable_x64", not args.float32)
    import pauliprop as pp
    from pauliprop import models

    steps = args.steps or (20 if args.observable == "z62" else 5)
    obs = models.single_z(62) if args.observable == "z62" else models.magnetization()
    refs = models.MIX_Z62_20_STEPS if args.observable == "z62" else models.EXACT_MZ_5_STEPS
    ref_name = "MIX (Begusic et al.)" if args.observable == "z62" else "exact"
    has_ref = (args.observable == "z62" and steps == 20) or (args.observable == "mz" and steps == 5)
    trunc = pp.Truncation(min_abs_coeff=args.min_abs_coeff, max_weight=args.max_weight or None,
                          max_terms=args.max_terms)
    print(f"127-qubit kicked Ising, <{'Z62' if args.observable == 'z62' else 'M_z'}> after {steps} steps, "
          f"{trunc}, backend {devices.backend()}", flush=True)
    print(f"{'theta_h':>10} {'estimate':>12} {ref_name:>22} {'|error|':>10} {'peak terms':>10} {'seconds':>8}", flush=True)
    circuit = models.kicked_ising(steps, pp.Param(0))  # the angle is data: one program for every angle
    start = 1 << 14  # each angle starts where the last one ended: no recompilation in the loop
    rows = []
    for k in _progress(args.angles):
        t0 = time.perf_counter()
        val, stats = pp.expectation(circuit, obs, params=[k * math.pi / 32], truncation=trunc, capacity=args.capacity,
                                    return_stats=True, initial_capacity=start)
        start = stats.capacity
        val = float(val)
        dt = time.perf_counter() - t0
        ref = refs.get(k) if has_ref else None
        rows.append((k, val, ref))
        ref_s = f"{ref:22.6f}" if ref is not None else f"{'-':>22}"
        err_s = f"{abs(val - ref):10.2e}" if ref is not None else f"{'-':>10}"
        _print(f"{k:>4}*pi/32 {val:12.6f} {ref_s} {err_s} {int(stats.max_terms_seen):10d} {dt:8.2f}")
    if not args.no_plot:
        where = _plot(rows, args.plot, f"<{'Z62' if args.observable == 'z62' else 'M_z'}> after {steps} steps, "
                      f"127 qubits", ref_name)
        print(f"plot written to {where}" if where else "no plot: matplotlib is not installed "
              "(pip install 'pauliprop[cli]')", flush=True)
    return 0


def _tqdm():
    """tqdm's progress bar class (the `cli` extra), or None without it."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def _progress(items):
    """A progress bar over the angles with tqdm installed; the items as they are without."""
    bar = _tqdm()
    return items if bar is None else bar(items, desc="angles", unit="angle", leave=False)


def _print(line: str):
    """A table row that does not break the progress bar."""
    bar = _tqdm()
    if bar is None:
        print(line, flush=True)
    else:
        bar.write(line)


def _plot(rows, path: str, title: str, ref_name: str) -> str | None:
    """The estimates (and the reference where there is one) against theta_h, as a PNG; its path, or
    None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ks = [k for k, _, _ in rows]
    ax.plot(ks, [v for _, v, _ in rows], "o-", label="pauliprop")
    refs = [(k, r) for k, _, r in rows if r is not None]
    if refs:
        ax.plot([k for k, _ in refs], [r for _, r in refs], "s", mfc="none", ms=9, label=ref_name)
    ax.set_xlabel("theta_h / (pi/32)")
    ax.set_ylabel("expectation value")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return os.path.abspath(path)


# ---- pauliprop estimate ---------------------------------------------------------------------------------

def _estimate_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="pauliprop estimate", description="<psi| O |psi> for psi = circuit |state>, by Pauli "
                "propagation (truncated as the flags say) or the exact state vector.")
    p.add_argument("circuit", help="OpenQASM 2 or 3 file (Qiskit's qasm2.dumps / qasm3.dumps), '-' for stdin")
    obs = p.add_mutually_exclusive_group(required=True)
    obs.add_argument("--observable", metavar="TEXT", help='a written sum, e.g. "Z0 Z1 + 0.5 X2 - 0.1 Y3"')
    obs.add_argument("--observable-file", metavar="FILE",
                     help="JSON: Qiskit's sparse list [[\"ZZ\", [0, 1], 1.0], ...] or {label: coeff} (label "
                          "character i is qubit i); any other text: a written sum")
    p.add_argument("--params", metavar="VALUES", help="OpenQASM 3 input parameters: name=value,... or values "
                   "in the order of the names")
    p.add_argument("--state", default="0", help="initial product state: 0, +, a bitstring or one of 01+-rl a "
                   "qubit (default 0)")
    p.add_argument("--method", choices=["pauli", "statevector"], default="pauli")
    p.add_argument("--min-abs-coeff", type=float, default=None)
    p.add_argument("--max-weight", type=int, default=None)
    p.add_argument("--max-terms", type=int, default=None)
    p.add_argument("--max-sins", type=int, default=None)
    p.add_argument("--per", choices=["gate", "layer"], default="gate", help="when the rules apply (default gate)")
    p.add_argument("--capacity", type=_positive, default=None, help="term buffer size (default: automatic)")
    p.add_argument("--float32", action="store_true", help="single precision coefficients")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _observable(args, num_qubits: int):
    import pauliprop as pp

    if args.observable is not None:
        return pp.PauliSum.from_text(args.observable, num_qubits)
    text = _read(args.observable_file)
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return pp.PauliSum.from_text(text, num_qubits)
    if isinstance(data, dict):
        return pp.PauliSum.from_labels(data, num_qubits)
    if isinstance(data, list):
        return pp.PauliSum.from_list(data, num_qubits)
    raise ValueError(f"{args.observable_file}: expected a JSON list of [label, qubits, coeff] or an object "
                     f"{{label: coeff}}, got {type(data).__name__}")


def _params(text: str | None):
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        if all("=" in t for t in items):
            return {k.strip(): float(v) for k, v in (t.split("=", 1) for t in items)}
        return [float(t) for t in items]
    except ValueError:
        raise ValueError(f"--params: expected name=value,... or numbers, got {text!r}") from None


def estimate(argv) -> int:
    args = _estimate_parser().parse_args(argv)
    try:
        out = _estimate(args)
    except (ValueError, TypeError, OSError, MemoryError, ImportError) as exc:
        print(f"pauliprop estimate: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
    else:
        print(f"value {out['value']:.12g}  ({out['method']}, {out['seconds']:.2f} s)")
        if out["method"] == "pauli":
            dropped = ", ".join(f"{k} {v:.3g}" for k, v in out["dropped_norm"].items() if v) or "none"
            print(f"dropped 1-norm {out['total_dropped_norm']:.3g} ({dropped}); peak terms {out['peak_terms']}, "
                  f"final terms {out['final_terms']}, capacity {out['capacity']}")
    return 0


def _estimate(args) -> dict:
    import jax

    jax.config.update("jax_enable_x64", not args.float32)
    import numpy as np

    import pauliprop as pp
    from pauliprop.propagation.truncation import RULES

    circuit = pp.Circuit.from_qasm(_read(args.circuit), _params(args.params))
    obs = _observable(args, circuit.num_qubits)
    t0 = time.perf_counter()
    if args.method == "statevector":
        rules = [args.min_abs_coeff, args.max_weight, args.max_terms, args.max_sins]
        if any(r is not None for r in rules):
            raise ValueError("--method statevector is exact: it takes no truncation flags")
        value = float(pp.expectation(circuit, obs, state=args.state, method="statevector"))
        return dict(value=value, method="statevector", seconds=time.perf_counter() - t0,
                    num_qubits=circuit.num_qubits, gates=len(circuit))
    trunc = pp.Truncation(max_weight=args.max_weight, min_abs_coeff=args.min_abs_coeff, max_terms=args.max_terms,
                          max_sins=args.max_sins, per=args.per)
    value, stats = pp.expectation(circuit, obs, state=args.state, truncation=trunc, capacity=args.capacity,
                                  return_stats=True)
    value = float(value)
    dropped = np.asarray(stats.dropped_norm, float)
    return dict(value=value, method="pauli", seconds=time.perf_counter() - t0, num_qubits=circuit.num_qubits,
                gates=len(circuit), truncation=str(trunc), dropped_norm=dict(zip(RULES, dropped.tolist())),
                total_dropped_norm=float(dropped.sum()), peak_terms=int(stats.max_terms_seen),
                final_terms=int(stats.terms[0]) if len(stats.terms) else len(obs), capacity=int(stats.capacity),
                overflow=bool(stats.overflow))


if __name__ == "__main__":
    raise SystemExit(main())
