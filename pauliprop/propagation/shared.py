"""Several observables through one propagation.

Backward propagation is linear in the observable's coefficients: with the truncation decisions
frozen, the estimate is sum_t c_t <P_t>, where <P_t> is the overlap of word t propagated alone. The
derivative of one run in its initial coefficients is exactly that vector (the adjoint sweep of
adjoint.py computes it with the value, in one pass). So K observables over the same circuit need one
propagation of the union of their words, not K:

    <H_k> = sum_t C[k, t] * d<H_w>/dw_t,    H_w = sum_t w_t P_t,  w_t = max_k |C[k, t]|.

Untruncated this is exact. Truncated, every observable shares the support the union run kept (a
word is kept while its weighted coefficient passes the cut), which is at least the support the
largest-weighted observable alone would keep for its own words.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..algebra.paulisum import PauliSum
from ..circuits.circuit import Circuit
from .propagate import expectation, is_traced, propagate
from .truncation import Truncation


def union(observables) -> tuple[PauliSum, jax.Array]:
    """(The distinct words of all observables with weights max_k |C[k, t]|, C of shape (K, T)).

    The words must be concrete (they fix the program's shapes); the coefficients may be traced.
    """
    observables = list(observables)
    if not observables:
        raise ValueError("expectations needs at least one observable")
    for k, o in enumerate(observables):
        if not isinstance(o, PauliSum):
            raise TypeError(f"observable {k} is a {type(o).__name__}, not a pauliprop.PauliSum")
    n = observables[0].num_qubits
    for k, o in enumerate(observables):
        if o.num_qubits != n:
            raise ValueError(f"observable {k} acts on {o.num_qubits} qubits, observable 0 on {n}")
        if isinstance(o.x, jax.core.Tracer) or isinstance(o.z, jax.core.Tracer):
            raise ValueError(f"observable {k}: its Pauli words are traced; only coefficients may be "
                             "transformed (the words fix the program's shapes)")
    words = np.concatenate([np.concatenate([np.asarray(o.x), np.asarray(o.z)], axis=1) for o in observables])
    distinct, index = np.unique(words, axis=0, return_inverse=True)
    index = index.reshape(-1)
    lanes = distinct.shape[1] // 2
    dtype = jnp.result_type(float)
    start = np.cumsum([0] + [len(o) for o in observables])
    matrix = jnp.zeros((len(observables), len(distinct)), dtype)
    for k, o in enumerate(observables):
        matrix = matrix.at[k, index[start[k]:start[k + 1]]].add(jnp.asarray(o.coeffs, dtype))
    weights = jnp.max(jnp.abs(matrix), axis=0)
    words = PauliSum(distinct[:, :lanes].astype(np.uint32), distinct[:, lanes:].astype(np.uint32), weights, n)
    return words, matrix


def expectations(circuit: Circuit, observables, params=None, state="0", truncation: Truncation | None = None,
                 capacity: int | None = None, initial_capacity: int | None = None) -> jax.Array:
    """[<psi| H_k |psi> for H_k in observables]: one propagation of their union, one adjoint sweep.

    Costs about one value-and-gradient of a single estimate however many observables there are.
    capacity: the term buffer's slots; None outside a trace: found by propagating the union once with
    automatic growth (initial_capacity: where that growth starts). Jittable and vmappable in params
    and in the observables' coefficients; to differentiate several estimates in params, vmap
    `expectation` (or `expectation_fn`) over the observables instead.
    """
    words, matrix = union(observables)
    if capacity is None and not is_traced(params, matrix):
        _, stats = propagate(circuit, words, params, truncation, initial_capacity=initial_capacity)
        capacity = stats.capacity
    dtype = jnp.result_type(float)
    per_word = _per_word(circuit, words, params, state, truncation, capacity)
    return matrix @ per_word.astype(dtype)


def _per_word(circuit, words, params, state, truncation, capacity):
    """d<H_w>/dw: each word's propagated overlap, with the union run's support; not differentiable in
    params (a second-order sweep the engine does not have)."""
    def per_word(p, w):
        return jax.grad(lambda cw: expectation(circuit, PauliSum(words.x, words.z, cw, words.num_qubits), p,
                                               state=state, truncation=truncation, capacity=capacity))(w)

    run = jax.custom_vjp(per_word)

    def fwd(p, w):
        if p.perturbed:
            raise ValueError("pauliprop.expectations is not differentiable in params (it shares one "
                             "propagation among the observables); differentiate jax.vmap of "
                             "pauliprop.expectation over the observables' coefficients instead")
        return per_word(p.value, w.value), None

    def bwd(_, ct):
        # frozen support: a word's propagated overlap does not depend on the weights
        return None, jnp.zeros_like(ct)

    run.defvjp(fwd, bwd, symbolic_zeros=True)
    params = jnp.zeros(0, jnp.result_type(float)) if params is None else params
    return run(params, words.coeffs)
