"""Qiskit's Estimator primitive on pauliprop: `pauliprop.Estimator`, a `qiskit.primitives.BaseEstimatorV2`.

Code written against Qiskit's primitives (`estimator.run([(circuit, observables, parameter_values)])`)
runs unchanged with it. Pubs are parsed by Qiskit itself (`EstimatorPub.coerce`: every pub form
`StatevectorEstimator` takes, observables and parameter values broadcast by its `ObservablesArray`
and `BindingsArray`); each pub's circuit is converted once (`Circuit.from_qiskit`, its Parameters
kept as `Param`s in `circuit.parameters` order), and each distinct observable of the pub is evaluated
for all of the pub's parameter sets in one batched `pauliprop.expectation` call (params of shape
(B, P), B padded to a power of two so that batches of similar size share one compiled program). Results are exact with method="statevector" or an untruncated "pauli" run; truncated, the
value is the truncated estimator's, and `stds` holds the 1-norm the truncation dropped: a bound
on |exact - estimate| (each dropped word would have contributed at most its |coefficient|), not a
standard error. Agreement with Qiskit to 1e-10 needs float64 (`jax.config.update("jax_enable_x64", True)`).

This module imports Qiskit (the `qasm` extra: `pip install "pauliprop[qasm]"`); `import pauliprop`
does not: `pauliprop.Estimator` loads it on first use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Iterable

import jax
import numpy as np

try:
    from qiskit.primitives import BaseEstimatorV2, DataBin, PrimitiveResult, PubResult
    from qiskit.primitives.containers.estimator_pub import EstimatorPub
    from qiskit.primitives.primitive_job import PrimitiveJob
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('pauliprop.Estimator needs Qiskit: pip install "pauliprop[qasm]"') from exc

from .algebra.paulisum import PauliSum
from .circuits.circuit import Circuit
from .propagation.propagate import expectation
from .propagation.truncation import Truncation
from .runtime import devices

METHODS = ("pauli", "statevector")
OPTIONS = ("state", "capacity", "initial_capacity")  # passed on to pauliprop.expectation

# Qiskit's SparseObservable projectors as (sign, Pauli) halves: 0 = (I + Z)/2, 1 = (I - Z)/2, ...
_PROJECTORS = {"0": (1, "Z"), "1": (-1, "Z"), "+": (1, "X"), "-": (-1, "X"), "r": (1, "Y"), "l": (-1, "Y")}


class Estimator(BaseEstimatorV2):
    """A `BaseEstimatorV2` whose expectation values are pauliprop's.

    truncation: a `pauliprop.Truncation` for method="pauli" (None: exact). method: "pauli" (backward
    Pauli propagation) or "statevector" (exact, small circuits). options: keywords passed on to
    `pauliprop.expectation`: "state" (the initial product state, "0" by default), "capacity",
    "initial_capacity". default_precision: the precision pubs get when neither they nor `run` give
    one; it is reported in each result's metadata (target_precision) and adds no noise: the values
    are deterministic. device: where the estimates are computed, a `jax.Device` or a platform's name
    ("cpu", "gpu"; None: JAX's default device); every pub runs under `jax.default_device(device)`, so
    on a machine with a GPU `device="cpu"` runs on the host (there, concrete calls take the native CPU
    engine).

    Each `PubResult` has `data.evs` and `data.stds` of the pub's broadcast shape (stds: the dropped
    1-norm, a bound on the truncation's error; 0 when nothing was dropped) and metadata with
    target_precision, circuit_metadata, method, truncation (its fields) and, for method="pauli", the
    peak and final term counts of the batched call that computed each value (arrays of the pub's shape).
    """

    def __init__(self, *, truncation: Truncation | None = None, method: str = "pauli", options: dict | None = None,
                 default_precision: float = 0.0, device=None):
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}: use 'pauli' or 'statevector'")
        if truncation is not None and not isinstance(truncation, Truncation):
            raise TypeError(f"truncation must be a pauliprop.Truncation, got {type(truncation).__name__}")
        if method == "statevector" and truncation is not None and not truncation.is_exact:
            raise ValueError("method='statevector' is exact: it takes no truncation")
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(OPTIONS)}")
        if default_precision < 0:
            raise ValueError(f"default_precision must be >= 0, got {default_precision}")
        self._truncation, self._method, self._options = truncation, method, options
        self._default_precision = float(default_precision)
        self._device = None if device is None else devices.resolve(device)

    @property
    def truncation(self) -> Truncation | None:
        return self._truncation

    @property
    def method(self) -> str:
        return self._method

    @property
    def options(self) -> dict:
        return dict(self._options)

    @property
    def default_precision(self) -> float:
        return self._default_precision

    @property
    def device(self):
        """The jax.Device the estimates are computed on (None: JAX's default device)."""
        return self._device

    def run(self, pubs: Iterable, *, precision: float | None = None) -> PrimitiveJob:
        """Estimate every pub: a job whose result() is a PrimitiveResult of one PubResult a pub."""
        if precision is None:
            precision = self._default_precision
        coerced = [_coerce(pub, precision, i) for i, pub in enumerate(pubs)]
        job = PrimitiveJob(self._run, coerced)
        job._submit()
        return job

    def _run(self, pubs: list[EstimatorPub]) -> PrimitiveResult:
        converted: dict[int, Circuit] = {}  # a circuit shared by several pubs converts once
        results = []
        # (the job's thread: jax.default_device is set per thread)
        with jax.default_device(self._device) if self._device is not None else contextlib.nullcontext():
            for pub in pubs:
                key = id(pub.circuit)
                if key not in converted:
                    converted[key] = Circuit.from_qiskit(pub.circuit)
                results.append(self._run_pub(pub, converted[key]))
        return PrimitiveResult(results, metadata={"version": 2})

    def _run_pub(self, pub: EstimatorPub, circuit: Circuit) -> PubResult:
        qc, values = pub.circuit, pub.parameter_values
        pshape, oshape = tuple(values.shape), tuple(pub.observables.shape)
        shape = np.broadcast_shapes(pshape, oshape)
        batch = int(np.prod(pshape, dtype=int))
        params = None
        if qc.num_parameters:  # (B, P) in qc.parameters order, the order Circuit.from_qiskit numbers them
            params = np.asarray(values.as_array(qc.parameters), dtype=float).reshape(batch, qc.num_parameters)
            # One set runs as (P,) (the engine's single-set loop); a batch is padded to a power of two
            # (copies of its last row), so batches of 3..4, 5..8, ... rows share one compiled program
            rows = 1 << (batch - 1).bit_length()
            params = params[0] if batch == 1 else np.concatenate([params, np.repeat(params[-1:], rows - batch, 0)])

        distinct: dict[tuple, int] = {}  # one batched call per distinct observable
        which = np.empty(oshape, dtype=int)
        for idx in np.ndindex(*oshape):
            terms = pub.observables[idx]
            which[idx] = distinct.setdefault(tuple(sorted(terms.items())), len(distinct))
        evs_of = np.zeros((len(distinct), batch))
        stds_of = np.zeros((len(distinct), batch))
        peak_of = np.zeros(len(distinct), dtype=int)
        final_of = np.zeros(len(distinct), dtype=int)
        for key, o in distinct.items():
            obs = _pauli_sum(dict(key), qc.num_qubits)
            val, stats = expectation(circuit, obs, params, truncation=self._truncation, method=self._method,
                                     return_stats=True, **self._options)
            evs_of[o] = np.broadcast_to(np.asarray(val, dtype=float).reshape(-1)[:batch], (batch,))
            if stats is not None:
                dropped = np.asarray(stats.dropped_norm, dtype=float).reshape(-1, stats.dropped_norm.shape[-1])
                stds_of[o] = np.broadcast_to(dropped.sum(axis=-1)[:batch], (batch,))
                peak_of[o] = int(stats.max_terms_seen)
                final_of[o] = int(stats.terms[0]) if len(stats.terms) else len(obs)

        o_index = np.broadcast_to(which, shape)
        b_index = np.broadcast_to(np.arange(batch).reshape(pshape), shape)
        evs, stds = evs_of[o_index, b_index], stds_of[o_index, b_index]
        metadata = {"target_precision": pub.precision, "circuit_metadata": qc.metadata, "method": self._method,
                    "truncation": dataclasses.asdict(self._truncation or Truncation()), "device": str(devices.device())}
        if self._method == "pauli":
            metadata["peak_terms"] = peak_of[o_index]
            metadata["final_terms"] = final_of[o_index]
        return PubResult(DataBin(evs=evs, stds=stds, shape=shape), metadata=metadata)


def _coerce(pub, precision, i: int) -> EstimatorPub:
    """Qiskit's own parsing of a pub; its refusal of a non-Hermitian observable names the terms."""
    try:
        return EstimatorPub.coerce(pub, precision)
    except ValueError as exc:
        if "Hermitian" not in str(exc) or not isinstance(pub, (tuple, list)) or len(pub) < 2:
            raise
        bad = _imaginary_terms(pub[1])
        if not bad:
            raise
        shown = ", ".join(f"{label} ({coeff:.3g})" for label, coeff in bad[:6]) + (", ..." if len(bad) > 6 else "")
        raise ValueError(f"pub {i}: the observable is not Hermitian: term(s) {shown} have imaginary "
                         f"coefficients (the Estimator takes Hermitian observables only)") from None


def _imaginary_terms(obs) -> list[tuple[str, complex]]:
    """(Qiskit label, coefficient) of the terms with imaginary coefficients, through nested arrays."""
    from qiskit.quantum_info import Pauli, SparseObservable, SparsePauliOp

    if isinstance(obs, (SparsePauliOp, Pauli)):
        op = SparsePauliOp(obs).simplify()
        return [(lab, complex(c)) for lab, c in op.to_list() if abs(complex(c).imag) > 1e-10]
    if isinstance(obs, SparseObservable):
        return _imaginary_terms(SparsePauliOp.from_sparse_observable(obs.as_paulis()))
    if isinstance(obs, dict):
        return [(str(lab), complex(c)) for lab, c in obs.items() if abs(complex(c).imag) > 1e-10]
    if isinstance(obs, (list, tuple, np.ndarray)):
        return [term for o in (obs.ravel() if isinstance(obs, np.ndarray) else obs) for term in _imaginary_terms(o)]
    return []


def _pauli_sum(terms: dict, num_qubits: int) -> PauliSum:
    """A Hermitian {Qiskit label: real coefficient} (letters I X Y Z and SparseObservable's projectors
    0 1 + - r l, rightmost = qubit 0) as an exact PauliSum; projectors are expanded as (I +- P)/2."""
    paulis: dict[str, float] = {}
    for label, coeff in terms.items():
        factors = [((1, ch),) if ch in "IXYZ" else ((0.5, "I"), (0.5 * _PROJECTORS[ch][0], _PROJECTORS[ch][1]))
                   for ch in reversed(label)]  # character q is qubit q from here on
        for choice in itertools.product(*factors):
            word = "".join(p for _, p in choice)
            paulis[word] = paulis.get(word, 0.0) + float(coeff) * float(np.prod([s for s, _ in choice]))
    return PauliSum.from_labels(paulis, num_qubits)
