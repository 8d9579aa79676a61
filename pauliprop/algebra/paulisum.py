"""PauliSum: a real linear combination of packed Pauli words, registered as a JAX pytree.

Terms may repeat and may have zero coefficients (fixed-capacity buffers produce both): every
consumer treats the sum as the plain sum of its terms; `simplify` merges them on the host.
Labels follow Stim's order (character i acts on qubit i); Qiskit's labels are reversed and the
conversions below take care of it.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from ..circuits.gates import pauli_matrix
from . import words


def _real(c, where: str) -> float:
    c = complex(c)
    if abs(c.imag) > 1e-12 * max(1.0, abs(c.real)):
        raise ValueError(f"{where}: coefficient {c} is not real; PauliSum holds Hermitian sums only")
    return c.real


@jax.tree_util.register_pytree_node_class
class PauliSum:
    """sum_t coeffs[t] * P_t with P_t = (x[t], z[t]) packed in uint32 lanes; n = num_qubits."""

    def __init__(self, x, z, coeffs, num_qubits: int):
        self.x, self.z, self.coeffs, self.num_qubits = x, z, coeffs, int(num_qubits)

    # ---- pytree -----------------------------------------------------------------------------------
    def tree_flatten(self):
        return (self.x, self.z, self.coeffs), self.num_qubits

    @classmethod
    def tree_unflatten(cls, num_qubits, children):
        return cls(*children, num_qubits)

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def from_words(cls, paulis: list[dict[int, str]], coeffs, num_qubits: int) -> "PauliSum":
        x, z = words.pack(paulis, num_qubits)
        # device_put: a transfer, where jnp.asarray compiles a small program for each new shape
        return cls(jax.device_put(x), jax.device_put(z), jax.device_put(np.asarray(coeffs, dtype=float)), num_qubits)

    @classmethod
    def from_list(cls, terms: Iterable, num_qubits: int) -> "PauliSum":
        """Qiskit's sparse-list form: [("ZZ", [0, 1], 1.0), ("X", [3], 0.5)]."""
        _check_n(num_qubits)
        paulis, coeffs = [], []
        for i, term in enumerate(terms):
            try:
                label, qubits, c = term
            except (TypeError, ValueError):
                raise ValueError(f"term {i}: expected (label, qubits, coeff), got {term!r}") from None
            label = str(label).upper()
            qubits = [int(q) for q in qubits]
            if len(label) != len(qubits):
                raise ValueError(f"term {i}: label '{label}' has {len(label)} letters but {len(qubits)} qubits")
            if len(set(qubits)) != len(qubits):
                raise ValueError(f"term {i}: repeated qubit in {qubits}")
            word = {}
            for ch, q in zip(label, qubits):
                if ch not in "IXYZ":
                    raise ValueError(f"term {i}: '{ch}' is not a Pauli letter (I, X, Y, Z)")
                if not 0 <= q < num_qubits:
                    raise ValueError(f"term {i}: qubit {q} out of range for {num_qubits} qubits")
                if ch != "I":
                    word[q] = ch
            paulis.append(word)
            coeffs.append(_real(c, f"term {i}"))
        return cls.from_words(paulis, coeffs, num_qubits)

    @classmethod
    def from_labels(cls, labels: Mapping[str, complex] | Iterable[str], num_qubits: int | None = None) -> "PauliSum":
        """{"XIZ": 0.5, ...}: character i acts on qubit i (Stim's order). A list means coefficient 1."""
        if not isinstance(labels, Mapping):
            labels = {lab: 1.0 for lab in labels}
        lengths = {len(lab) for lab in labels}
        if len(lengths) > 1:
            raise ValueError(f"labels have different lengths {sorted(lengths)}")
        n = num_qubits if num_qubits is not None else (lengths.pop() if lengths else None)
        if n is None:
            raise ValueError("from_labels: no labels and no num_qubits")
        terms = []
        for lab, c in labels.items():
            if len(lab) != n:
                raise ValueError(f"label '{lab}' has {len(lab)} letters, expected {n}")
            terms.append((lab, list(range(n)), c))
        return cls.from_list(terms, n)

    @classmethod
    def from_text(cls, text: str, num_qubits: int | None = None) -> "PauliSum":
        """From a written sum such as "Z0 Z1 + 0.5 X2 - 2e-3 * Y0 Z7" (a term: an optional
        coefficient, then Pauli letters with their qubit, separated by spaces or '*'; a lone number is
        that multiple of the identity). num_qubits: the register (default: the largest qubit + 1).
        Errors name the character or the term at fault."""
        if not isinstance(text, str):
            raise TypeError(f"expected the observable as text, got {type(text).__name__}")
        terms, pos = [], 0
        while True:
            sign, pos = _sign(text, pos, first=not terms)
            coeff, letters, qubits, start = 1.0, "", [], pos
            number = _NUMBER.match(text, pos)
            if number:
                coeff, pos = float(number.group(1)), _skip_times(text, number.end())
            while True:
                factor = _FACTOR.match(text, pos)
                if not factor:
                    break
                q = int(factor.group(2))
                if q in qubits:
                    raise ValueError(f"observable: qubit {q} appears twice in the term "
                                     f"'{text[start:factor.end()].strip()}'")
                letters, qubits, pos = letters + factor.group(1).upper(), qubits + [q], _skip_times(text, factor.end())
            if not number and not letters:
                found = text[pos:].strip()
                raise ValueError(f"observable: expected a term at character {pos + 1}"
                                 + (f", found '{found[:12]}'" if found else " (the text ends)"))
            terms.append((letters, qubits, sign * coeff))
            if not text[pos:].strip():
                break
            if text[pos:].lstrip()[:1] not in "+-":
                at = pos + len(text[pos:]) - len(text[pos:].lstrip())
                raise ValueError(f"observable: unexpected '{text[at]}' at character {at + 1} "
                                 "(terms are joined by + or -, factors look like X0, Z12)")
        n = num_qubits if num_qubits is not None else 1 + max((q for _, qs, _ in terms for q in qs), default=0)
        for letters, qubits, _ in terms:
            for q in qubits:
                if q >= n:
                    raise ValueError(f"observable: qubit {q} is out of range for {n} qubits")
        return cls.from_list(terms, n)

    @classmethod
    def from_qiskit(cls, op) -> "PauliSum":
        """From a qiskit.quantum_info.SparsePauliOp (or Pauli); Qiskit labels are reversed."""
        from qiskit.quantum_info import SparsePauliOp

        op = SparsePauliOp(op)
        return cls.from_list(op.to_sparse_list(), op.num_qubits)

    @classmethod
    def from_stim(cls, ps, coeff: float = 1.0) -> "PauliSum":
        """From a stim.PauliString (its sign must be real)."""
        sign = _real(ps.sign, "stim.PauliString sign")
        word = {q: "_XYZ"[p] for q, p in enumerate(ps) if p}
        return cls.from_words([word], [sign * coeff], len(ps))

    # ---- export -----------------------------------------------------------------------------------------
    def to_list(self) -> list[tuple[str, list[int], float]]:
        """Sparse-list form (non-identity letters and their qubits), one entry per stored term."""
        out = []
        for lab, c in zip(self.labels(), np.asarray(self.coeffs)):
            qs = [q for q, ch in enumerate(lab) if ch != "I"]
            out.append(("".join(lab[q] for q in qs), qs, float(c)))
        return out

    def labels(self) -> list[str]:
        if len(self) == 0:  # words.unpack_bits cannot reshape a (0, W) array
            return []
        return words.labels_of(np.asarray(self.x), np.asarray(self.z), self.num_qubits)

    def to_dict(self) -> dict[str, float]:
        """{label: coefficient} with duplicates merged and zero terms dropped."""
        out: dict[str, float] = {}
        for lab, c in zip(self.labels(), np.asarray(self.coeffs)):
            out[lab] = out.get(lab, 0.0) + float(c)
        return {k: v for k, v in out.items() if v != 0.0}

    def to_qiskit(self):
        from qiskit.quantum_info import SparsePauliOp

        terms = self.to_list() or [("", [], 0.0)]
        return SparsePauliOp.from_sparse_list(terms, self.num_qubits).simplify(atol=0)

    def to_matrix(self) -> np.ndarray:
        """Dense 2^n x 2^n matrix (little-endian), for small n in tests."""
        dim = 2**self.num_qubits
        m = np.zeros((dim, dim), dtype=complex)
        for lab, c in self.to_dict().items():
            m += c * pauli_matrix(lab)
        return m

    def simplify(self, atol: float = 0.0) -> "PauliSum":
        """Merge duplicate words and drop terms with |coeff| <= atol (host-side)."""
        d = {k: v for k, v in self.to_dict().items() if abs(v) > atol}
        if not d:
            return PauliSum.from_list([], self.num_qubits)
        return PauliSum.from_labels(d, self.num_qubits)

    # ---- arithmetic -------------------------------------------------------------------------------------
    def __len__(self):
        return int(self.coeffs.shape[0])

    @property
    def num_lanes(self) -> int:
        return int(self.x.shape[-1])

    def __add__(self, other: "PauliSum") -> "PauliSum":
        if other.num_qubits != self.num_qubits:
            raise ValueError(f"cannot add sums on {self.num_qubits} and {other.num_qubits} qubits")
        cat = lambda a, b: jnp.concatenate([jnp.asarray(a), jnp.asarray(b)])
        return PauliSum(cat(self.x, other.x), cat(self.z, other.z), cat(self.coeffs, other.coeffs), self.num_qubits)

    def __mul__(self, k) -> "PauliSum":
        return PauliSum(self.x, self.z, self.coeffs * k, self.num_qubits)

    __rmul__ = __mul__

    def __repr__(self):
        if isinstance(self.coeffs, jax.core.Tracer):
            return f"PauliSum(num_qubits={self.num_qubits}, terms={len(self)}, traced)"
        d = self.to_dict()
        shown = " + ".join(f"{c:.6g}*{lab}" for lab, c in list(d.items())[:8])
        more = f" + ... ({len(d)} terms)" if len(d) > 8 else ""
        return f"PauliSum(num_qubits={self.num_qubits}: {shown or '0'}{more})"


_NUMBER = re.compile(r"\s*((?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)")
_FACTOR = re.compile(r"\s*([IXYZixyz])(\d+)")
_SIGN = re.compile(r"\s*([-+])")
_TIMES = re.compile(r"\s*\*")


def _sign(text: str, pos: int, first: bool) -> tuple[float, int]:
    """The +/- before a term (optional before the first), and where the term starts."""
    m = _SIGN.match(text, pos)
    if m:
        return (-1.0 if m.group(1) == "-" else 1.0), m.end()
    if not first:
        raise ValueError(f"observable: expected + or - at character {pos + 1}")
    return 1.0, pos


def _skip_times(text: str, pos: int) -> int:
    m = _TIMES.match(text, pos)
    return m.end() if m else pos


def _check_n(n):
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"num_qubits must be a positive int, got {n!r}")
