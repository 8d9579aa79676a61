"""OpenQASM and Qiskit import (the optional `qasm` extra: `pip install "pauliprop[qasm]"`).

Parsing is Qiskit's: `qiskit.qasm2.loads` for OpenQASM 2.0 (with Qiskit's legacy qelib1.inc
gate set, as `QuantumCircuit.from_qasm_str` and Qiskit's exporter use it) and `qiskit.qasm3.loads`
(qiskit-qasm3-import) for the OpenQASM 3 gate subset. The resulting `QuantumCircuit` is converted
by `circuit_from_qiskit`:

- gates of the pauliprop table (`pauliprop.circuits.gates.GATES`) map one to one (matched on Qiskit's gate
  class, not on the name, so a user `gate` that happens to be called `rzz` is expanded from its
  own definition); the table's composites (p/u1, u/u3, u2, r, rzx, cp/cu1, crx/cry/crz, cu, cu3, ch,
  ccx, ccz, rccx) carry their own exact decompositions into Pauli rotations and Cliffords;
- unbound Parameters, and expressions affine in one of them, become `Param`s (`Circuit.from_qiskit`);
- a `PauliEvolutionGate` exp(-i t H) becomes one Pauli rotation a term of H (angle 2 c t) when H's terms
  commute, which is exact; with non-commuting terms it is refused: Qiskit's definition of it is then a
  product formula (an approximation, which Qiskit's Statevector and Operator do not use);
- everything else is expanded through `operation.definition` (Qiskit's exact definitions, user
  `gate` bodies) until only table gates remain.

All decompositions are exact up to a global phase, which is dropped (expectation values do not see
it). Barriers, delays and global-phase gates are skipped. Measurements, resets and classical control
flow are refused: pauliprop evaluates expectation values of unitary circuits.

Errors are `ValueError`s naming the cause; for QASM text they name the line (and, for syntax errors,
the column, counted from 1, and the offending token).

The converters build through the circuit class they are handed (`Circuit.from_qasm` and
`Circuit.from_qiskit` pass their own), so this module does not import the builder that calls it.
"""

from __future__ import annotations

import math
import re
from typing import Mapping

import numpy as np

_INSTALL_HINT = 'OpenQASM/Qiskit import needs Qiskit: pip install "pauliprop[qasm]"'
_MAX_DEPTH = 64  # nesting of definitions; Qiskit's own definitions are far shallower


def _require_qiskit():
    try:
        import qiskit  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_INSTALL_HINT) from exc
    return qiskit


class _Unsupported(ValueError):
    """Raised while converting: `index` is the position of the top-level instruction at fault."""

    def __init__(self, index: int, where: str, detail: str):
        self.index, self.where, self.detail = index, where, detail
        super().__init__(f"instruction {index} ({where}): {detail}")


# ---- Qiskit QuantumCircuit -> Circuit ----------------------------------------------------------


def _angle(value, index, where, positions=None, new_param=None):
    """A float, or (with new_param) a Param, from a Qiskit gate parameter: a float, a numpy number,
    a bound ParameterExpression, or one affine in a single unbound Parameter (scale * p + offset, p at
    positions[p] of the circuit's parameters)."""
    params = getattr(value, "parameters", None)
    if params and new_param is None:
        names = ", ".join(sorted(p.name for p in params))
        raise _Unsupported(index, where, f"angle depends on unbound parameter(s) {names}; bind them first "
                                         f"(qc.assign_parameters)")
    if params:
        if len(params) > 1:
            names = ", ".join(sorted(p.name for p in params))
            raise _Unsupported(index, where, f"angle {value} depends on several parameters ({names}); pauliprop's "
                                             f"angles are affine in one parameter (scale * p + offset)")
        (p,) = params
        if p not in positions:
            raise _Unsupported(index, where, f"angle {value} depends on parameter {p.name}, which is not one of "
                                             f"the circuit's parameters")
        try:
            slope = value.gradient(p)
            affine = not getattr(slope, "parameters", None)
            scale = complex(slope) if affine else None
            offset = complex(value.bind({p: 0.0})) if affine else None
        except (TypeError, ValueError, ZeroDivisionError, RuntimeError):
            affine = False
        if not affine:
            raise _Unsupported(index, where, f"angle {value} is not affine in {p.name}; pauliprop's angles are "
                                             f"scale * {p.name} + offset (bind {p.name} first to use this gate)")
        if scale.imag or offset.imag or not (math.isfinite(scale.real) and math.isfinite(offset.real)):
            raise _Unsupported(index, where, f"angle {value} is not a real affine function of {p.name}")
        return new_param(positions[p], scale.real, offset.real)
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise _Unsupported(index, where, f"angle {value!r} is not a real number") from None
    if not math.isfinite(v):
        raise _Unsupported(index, where, f"angle {v} is not finite")
    return v


def _tables():
    """Qiskit gate class -> the pauliprop table gate it is (composites decompose in the table)."""
    from qiskit.circuit import library as lib

    return {
        lib.IGate: "id", lib.HGate: "h", lib.XGate: "x", lib.YGate: "y", lib.ZGate: "z",
        lib.SGate: "s", lib.SdgGate: "sdg", lib.SXGate: "sx", lib.SXdgGate: "sxdg",
        lib.TGate: "t", lib.TdgGate: "tdg",
        lib.CXGate: "cx", lib.CYGate: "cy", lib.CZGate: "cz", lib.SwapGate: "swap", lib.iSwapGate: "iswap",
        lib.RXGate: "rx", lib.RYGate: "ry", lib.RZGate: "rz",
        lib.RXXGate: "rxx", lib.RYYGate: "ryy", lib.RZZGate: "rzz", lib.ECRGate: "ecr",
        lib.PhaseGate: "p", lib.U1Gate: "p", lib.UGate: "u", lib.U3Gate: "u", lib.U2Gate: "u2", lib.RGate: "r",
        lib.RZXGate: "rzx", lib.CPhaseGate: "cp", lib.CU1Gate: "cp", lib.CRXGate: "crx", lib.CRYGate: "cry",
        lib.CRZGate: "crz", lib.CUGate: "cu", lib.CU3Gate: "cu3", lib.CHGate: "ch", lib.CCXGate: "ccx",
        lib.CCZGate: "ccz", lib.RCCXGate: "rccx",
    }


_TABLES = None


def _get_tables():
    global _TABLES
    if _TABLES is None:
        _TABLES = _tables()
    return _TABLES


def _default_ctrl_state(op) -> bool:
    """True unless op is a controlled gate with some open (0-) control."""
    n = getattr(op, "num_ctrl_qubits", 0)
    return not n or getattr(op, "ctrl_state", (1 << n) - 1) == (1 << n) - 1


def _emit(c, op, qubits: list[int], index: int, path: tuple[str, ...], ctx):
    from qiskit.circuit import Barrier, ControlFlowOp, Delay, Measure, Reset
    from qiskit.circuit.library import GlobalPhaseGate

    try:
        from qiskit.circuit import BoxOp
    except ImportError:  # pragma: no cover - Qiskit < 2.0
        BoxOp = ()

    name = getattr(op, "name", type(op).__name__)
    where = " inside ".join(f"'{p}'" for p in (name, *reversed(path))) + f" on qubit(s) {qubits}"
    if len(path) > _MAX_DEPTH:
        raise _Unsupported(index, where, "definitions nest too deeply (recursive gate definition?)")
    if isinstance(op, (Barrier, Delay, GlobalPhaseGate)):
        return
    if isinstance(op, Measure) or name == "measure":
        raise _Unsupported(index, where, "measurements are not supported: pauliprop estimates expectation "
                                         "values of unitary circuits (remove the measurements)")
    if isinstance(op, Reset) or name == "reset":
        raise _Unsupported(index, where, "resets are not supported: pauliprop estimates expectation values "
                                         "of unitary circuits")
    if BoxOp and isinstance(op, BoxOp):
        body = op.blocks[0]
        _emit_circuit(c, body, [qubits[body.find_bit(q).index] for q in body.qubits], index, (*path, name))
        return
    if isinstance(op, ControlFlowOp) or getattr(op, "condition", None) is not None:
        raise _Unsupported(index, where, "classical control flow is not supported: pauliprop estimates "
                                         "expectation values of unitary circuits")
    if _is_pauli_evolution(op):
        _emit_pauli_evolution(c, op, qubits, index, where, ctx)
        return
    direct = _get_tables()
    base = getattr(op, "base_class", type(op))
    params = getattr(op, "params", [])
    if base in direct and _default_ctrl_state(op):
        c.append(direct[base], qubits, *[_angle(p, index, where, *ctx) for p in params])
        return
    try:
        definition = getattr(op, "definition", None)
    except Exception as exc:  # noqa: BLE001 - Qiskit's CircuitError, e.g. rv's definition with unbound parameters
        unbound = any(getattr(p, "parameters", None) for p in params)
        raise _Unsupported(index, where, f"Qiskit cannot expand gate '{name}'"
                                         + (" with unbound parameters (bind them first)" if unbound else "")
                                         + f": {exc}") from None
    if definition is None and hasattr(op, "to_instruction"):
        try:
            definition = op.to_instruction().definition
        except Exception:  # noqa: BLE001 - fall through to the error below
            definition = None
    if definition is None:
        raise _Unsupported(index, where, f"gate '{name}' is not in pauliprop's gate table and has no "
                                         f"definition to expand (an opaque gate?)")
    for p in params:  # a clear error for unbound or non-affine angles before expanding
        if getattr(p, "parameters", None):
            _angle(p, index, where, *ctx)
    _emit_circuit(c, definition, qubits, index, (*path, name), ctx)


def _is_pauli_evolution(op) -> bool:
    from qiskit.circuit.library import PauliEvolutionGate

    return isinstance(op, PauliEvolutionGate)


def _emit_pauli_evolution(c, op, qubits: list[int], index: int, where: str, ctx):
    """exp(-i t H) as exp(-i (2 c_k t)/2 P_k) for each term c_k P_k of H, exact when the terms commute (an
    identity term is a global phase). Non-commuting terms are refused: no finite product of Pauli
    rotations is exp(-i t H), and Qiskit's definition (a product formula) only approximates it."""
    from qiskit.quantum_info import SparseObservable, SparsePauliOp

    parts = op.operator if isinstance(op.operator, list) else [op.operator]
    parts = [SparsePauliOp.from_sparse_observable(p.as_paulis()) if isinstance(p, SparseObservable) else p
             for p in parts]
    h = SparsePauliOp.sum(parts).simplify(atol=0.0, rtol=0.0)  # merges repeated terms, drops none
    x, z = h.paulis.x.astype(np.int64), h.paulis.z.astype(np.int64)
    anticommuting = (x @ z.T + z @ x.T) % 2
    if anticommuting.any():
        i, j = (int(k) for k in np.argwhere(anticommuting)[0])
        labels = h.paulis.to_labels()
        raise _Unsupported(index, where, f"the terms {labels[i]} and {labels[j]} of the evolved operator do not "
                                         f"commute: exp(-i t H) is then no finite product of Pauli rotations, and "
                                         f"Qiskit's definition of it is a product formula (an approximation); to "
                                         f"run that formula, decompose the gate first (qc.decompose())")
    time = op.params[0]
    for label, coeff in zip(h.paulis.to_labels(), h.coeffs):
        coeff = complex(coeff)
        if coeff.imag:
            raise _Unsupported(index, where, f"the evolved operator is not Hermitian: term {label} has the "
                                             f"coefficient {coeff}")
        sites = [(qubits[j], ch) for j, ch in enumerate(reversed(label)) if ch != "I"]  # rightmost: qubit 0
        if not sites:
            continue
        angle = _angle(2.0 * coeff.real * time, index, where, *ctx)
        c.append("pauli_rotation", [q for q, _ in sites], angle, pauli="".join(ch for _, ch in sites))


def _emit_circuit(c, qc, qubits: list[int], index: int, path: tuple[str, ...], ctx):
    """Append the instructions of a (sub)circuit whose qubit k is qubits[k]."""
    for inst in qc.data:
        qs = [qubits[qc.find_bit(q).index] for q in inst.qubits]
        _emit(c, inst.operation, qs, index, path, ctx)


def _convert(qc, new_circuit, new_param=None):
    if qc.num_qubits < 1:
        raise ValueError("the circuit has no qubits")
    c = new_circuit(qc.num_qubits)
    ctx = ({p: k for k, p in enumerate(qc.parameters)}, new_param)
    for i, inst in enumerate(qc.data):
        qs = [qc.find_bit(q).index for q in inst.qubits]
        _emit(c, inst.operation, qs, i, (), ctx)
    return c


def circuit_from_qiskit(qc, new_circuit, new_param=None):
    """Convert a `qiskit.QuantumCircuit` into a pauliprop `Circuit`, exactly up to a global phase.
    new_circuit: the circuit class (`Circuit.from_qiskit` passes its own), called with the number of
    qubits; the gates are appended through its builder methods.

    Qubit i of the Qiskit circuit is qubit i here (both little-endian). Table gates map one to one,
    other gates are expanded (see the module docstring). new_param: the angle class (`Param`):
    with it, an unbound Parameter p, or an expression affine in one (2 * p + 0.3), becomes
    new_param(k, scale, offset) with k = p's position in qc.parameters (Qiskit's order, the order of
    the values its primitives bind), so params[k] is p's value and jax.grad is the gradient in
    qc.parameters; an expression in several parameters or not affine raises a `ValueError` naming the
    gate and the expression. Without it, parameters must be bound. Barriers and delays are skipped;
    measurements, resets and classical control raise `ValueError`.
    """
    _require_qiskit()
    from qiskit import QuantumCircuit

    if not isinstance(qc, QuantumCircuit):
        raise TypeError(f"expected a qiskit.QuantumCircuit, got {type(qc).__name__}")
    if qc.parameters and new_param is None:
        names = ", ".join(p.name for p in qc.parameters)
        raise ValueError(f"the circuit has unbound parameter(s) {names}; bind them first "
                         f"(qc.assign_parameters({{...}}))")
    try:
        return _convert(qc, new_circuit, new_param)
    except _Unsupported as exc:
        raise ValueError(str(exc)) from None


# ---- OpenQASM text ---------------------------------------------------------------------------

_VERSION = re.compile(r"\s*(?:(?://[^\n]*(?:\n|$)|/\*.*?\*/)\s*)*OPENQASM\s+([0-9]+)", re.S)
_TOKEN = re.compile(r"[A-Za-z_$][\w$]*|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|->|==|\S")


def _qasm_version(text: str) -> int:
    m = _VERSION.match(text)
    if m:
        return int(m.group(1))
    # OpenQASM 3 makes the version line optional; OpenQASM 2 requires it.
    return 3 if re.search(r"\bqubit\b|stdgates\.inc", text) else 2


def _token_at(text: str, line: int, col0: int) -> str:
    """The token at (1-based line, 0-based column) of text, for error messages."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return "end of input"
    m = _TOKEN.match(lines[line - 1], col0)
    if m is None:
        rest = lines[line - 1][col0:].strip()
        return rest[:20] if rest else "end of line"
    return m.group(0)


def _located(text: str, line: int, col0: int | None, msg: str) -> ValueError:
    if col0 is None:
        return ValueError(f"QASM line {line}: {msg}")
    tok = _token_at(text, line, col0)
    near = "" if f"'{tok}'" in msg else f" (at '{tok}')"
    return ValueError(f"QASM line {line}, column {col0 + 1}: {msg}{near}")


def _statement_ends(text: str) -> list[int]:
    """Offsets just past each top-level statement (a ';' or a closing '}' at brace depth 0).

    A lexical scan (comments, strings, braces) only, used to find the line of an instruction that
    Qiskit parsed but pauliprop refuses: Qiskit's circuits do not keep source positions.
    """
    ends, depth, i, n = [], 0, 0, len(text)
    while i < n:
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        ch = text[i]
        if ch == '"':
            j = text.find('"', i + 1)
            i = n if j < 0 else j + 1
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                ends.append(i + 1)
        elif ch == ";" and depth == 0:
            ends.append(i + 1)
        i += 1
    return ends


def _statement_at(text: str, ends: list[int], k: int) -> tuple[int, str]:
    """(1-based line, abbreviated text) of statement k."""
    start = ends[k - 1] if k > 0 else 0
    i = start
    while i < ends[k]:  # skip blanks and comments before the statement
        if text[i].isspace():
            i += 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = ends[k] if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            i = ends[k] if j < 0 else j + 2
        else:
            break
    snippet = " ".join(text[i:ends[k]].split())
    if len(snippet) > 60:
        snippet = snippet[:57] + "..."
    return text.count("\n", 0, i) + 1, snippet


def _loads(text: str, version: int):
    import qiskit.qasm2 as q2

    if version == 3:
        try:
            import qiskit_qasm3_import  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError('OpenQASM 3 import needs qiskit-qasm3-import: pip install "pauliprop[qasm]"') from exc
        import qiskit.qasm3 as q3

        return q3.loads(text)
    return q2.loads(text, include_path=q2.LEGACY_INCLUDE_PATH, custom_instructions=q2.LEGACY_CUSTOM_INSTRUCTIONS,
                    custom_classical=q2.LEGACY_CUSTOM_CLASSICAL, strict=False)


def _try_loads(text: str, version: int):
    try:
        return _loads(text, version)
    except ImportError:
        raise
    except Exception:  # noqa: BLE001 - any failure counts as "this prefix does not load"
        return None


def _first_failing_statement(text: str, version: int) -> tuple[int, str] | None:
    """Bisect over statement prefixes for the first statement after which loading fails."""
    ends = _statement_ends(text)
    lo, hi = 0, len(ends) - 1  # invariant: the answer is in [lo, hi]
    if hi < 0 or _try_loads(text[:ends[hi]], version) is not None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _try_loads(text[:ends[mid]], version) is None:
            hi = mid
        else:
            lo = mid + 1
    return _statement_at(text, ends, lo)


def _statement_of_instruction(text: str, version: int, index: int) -> tuple[int, str] | None:
    """The statement that produced top-level instruction `index` of the loaded circuit."""
    ends = _statement_ends(text)
    lo, hi = 0, len(ends) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        qc = _try_loads(text[:ends[mid]], version)
        if qc is not None and len(qc.data) > index:
            hi = mid
        else:
            lo = mid + 1
    return _statement_at(text, ends, lo) if ends else None


_POSITION2 = re.compile(r"<input>:(\d+),(\d+):\s*(.*)", re.S)
_POSITION3 = re.compile(r"(\d+),(\d+):\s*(.*)", re.S)
_POSITION_ANTLR = re.compile(r"L(\d+):C(\d+):\s*(.*)", re.S)


def _message(exc) -> str:
    msg = getattr(exc, "message", None)
    return msg if isinstance(msg, str) else str(exc)


def _parse_error(text: str, version: int, exc: Exception) -> ValueError:
    """A ValueError naming line, column and token for an exception raised by Qiskit's loaders."""
    msg = _message(exc).strip()
    for pattern in (_POSITION2, _POSITION_ANTLR, _POSITION3):
        m = pattern.match(msg)
        if m:
            return _located(text, int(m.group(1)), int(m.group(2)), m.group(3).strip())
    # openqasm3's parser bails out with an empty message; the token is on the ANTLR exception
    cause = exc.__cause__
    recog = cause.args[0] if cause is not None and cause.args else None
    tok = getattr(recog, "offendingToken", None)
    if tok is not None:
        what = "unexpected end of input" if tok.text == "<EOF>" else f"syntax error at '{tok.text}'"
        try:
            rec = recog.recognizer
            expected = recog.getExpectedTokens().toString(rec.literalNames, rec.symbolicNames)
            if expected and len(expected) <= 60:
                what += f", expected {expected}"
        except Exception:  # noqa: BLE001 - the hint is optional
            pass
        return ValueError(f"QASM line {tok.line}, column {tok.column + 1}: {what}")
    kind = type(exc).__name__
    detail = f"{kind}: {msg}" if msg else kind
    found = _first_failing_statement(text, version)
    if found is not None:
        line, snippet = found
        return ValueError(f"QASM line {line}: cannot import '{snippet}': {detail}")
    return ValueError(f"QASM import failed: {detail}")


def _bound_values(parameters, params) -> dict:
    """{Qiskit Parameter: float} for a program's input parameters from `params` (names or order)."""
    names = [p.name for p in parameters]
    if params is None or len(params) == 0:
        raise ValueError(f"QASM program has free parameter(s) {', '.join(names)}: give their values (params)")
    if isinstance(params, Mapping):
        unknown = sorted(set(params) - set(names))
        missing = [n for n in names if n not in params]
        if unknown or missing:
            raise ValueError("QASM parameters: " + "; ".join(
                ([f"no input parameter named {', '.join(unknown)}"] if unknown else [])
                + ([f"no value for {', '.join(missing)}"] if missing else [])) + f" (the program has {', '.join(names)})")
        values = [params[n] for n in names]
    else:
        values = list(params)
        if len(values) != len(names):
            raise ValueError(f"QASM program has {len(names)} input parameter(s) ({', '.join(names)}), "
                             f"but {len(values)} value(s) were given")
    out = {}
    for p, v in zip(parameters, values):
        try:
            out[p] = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"QASM parameter {p.name}: {v!r} is not a number") from None
    return out


def circuit_from_qasm(text: str, params, new_circuit):
    """Parse OpenQASM 2.0 (qelib1.inc) or the OpenQASM 3 gate subset into a `Circuit`.

    The version comes from the `OPENQASM` header (without one, a program that declares `qubit`s or
    includes stdgates.inc is read as OpenQASM 3). Qubits are numbered in declaration order over all
    registers (qubit i is bit i of the basis index). Errors are `ValueError`s naming the line.
    params: values of an OpenQASM 3 program's `input` parameters, {name: value} or a sequence in the
    order of their names (Qiskit's order). new_circuit: as in `circuit_from_qiskit`.
    """
    _require_qiskit()
    if not isinstance(text, str):
        raise TypeError(f"expected OpenQASM text (str), got {type(text).__name__}")
    version = _qasm_version(text)
    if version not in (2, 3):
        raise ValueError(f"unsupported OpenQASM version {version} (2 and 3 are supported)")
    try:
        qc = _loads(text, version)
    except ImportError:
        raise
    except Exception as exc:  # noqa: BLE001 - Qiskit's parsers raise several types; all are reported
        raise _parse_error(text, version, exc) from None
    if qc.parameters:  # OpenQASM 3 `input angle` declarations
        qc = qc.assign_parameters(_bound_values(qc.parameters, params))
    elif params:
        raise ValueError(f"QASM program has no input parameters, but {len(params)} value(s) were given")
    try:
        return _convert(qc, new_circuit)
    except _Unsupported as exc:
        found = _statement_of_instruction(text, version, exc.index)
        if found is None:
            raise ValueError(f"QASM: {exc}") from None
        line, snippet = found
        raise ValueError(f"QASM line {line}: '{snippet}': {exc.detail} ({exc.where})") from None
