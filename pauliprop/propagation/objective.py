"""Objectives for variational loops: a pure `params -> <H>` function with its capacity fixed once.

    energy = pp.expectation_fn(circuit, H, params0, truncation=pp.Truncation(min_abs_coeff=1e-6))
    step = jax.jit(jax.value_and_grad(energy))            # compiles once; optax does the rest

Inside `jax.jit` the term buffer cannot grow (static shapes), so the capacity is found here, once,
outside any trace: the circuit is propagated at `params0` with automatic growth, and the capacity it
needed times `headroom` is fixed for every later call. Should a later point need more (truncation
by magnitude keeps a support that depends on the angles), the overflow is reported by a warning and
in the stats (`return_stats=True`), never silently; `f.refit(params)` then gives the same objective
with a capacity probed at those parameters (one new compilation).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..algebra.paulisum import PauliSum
from ..circuits.circuit import Circuit
from .propagate import CPU_COMPILER_OPTIONS, expectation, propagate
from .truncation import Truncation
from ..runtime import devices


def expectation_fn(circuit: Circuit, observable: PauliSum, params0=None, *, state="0",
                   truncation: Truncation | None = None, capacity: int | None = None, headroom: float = 2.0,
                   initial_capacity: int | None = None, method: str = "pauli",
                   return_stats: bool = False) -> Callable:
    """A pure function `f(params, coeffs=None) -> <psi(params)| H(coeffs) |psi(params)>`.

    Jittable, differentiable (`jax.grad`, `jax.value_and_grad`) and batchable (`jax.vmap`) in
    `params` and in `coeffs`, the observable's coefficients (default: its own). `f.value_and_grad`
    is `jax.jit(jax.value_and_grad(f))`, with the engine's compiler options. `f.capacity` is the
    fixed term capacity: `capacity` when given, else the one propagation at `params0` needed (params0
    defaults to angles drawn uniformly from [0, 2 pi) with seed 0) times `headroom`, as a power of two;
    initial_capacity: where that probe's automatic growth starts (each doubling costs a compilation).
    `f.refit(params)`: the same objective with its capacity probed at `params` (never smaller).
    return_stats: f returns (value, PropagationStats); `f.value_and_grad` then returns
    ((value, stats), grad).
    """
    settings = dict(state=state, truncation=truncation, headroom=headroom, method=method, return_stats=return_stats)
    if method not in ("pauli", "statevector"):
        raise ValueError(f"unknown method {method!r}: use 'pauli' or 'statevector'")
    if headroom < 1:
        raise ValueError(f"headroom must be >= 1, got {headroom}")
    if params0 is None:
        params0 = np.random.default_rng(0).uniform(0, 2 * math.pi, circuit.num_params)
    if method == "pauli" and capacity is None:
        _, stats = propagate(circuit, observable, params0, truncation, initial_capacity=initial_capacity)
        need = max(int(stats.max_terms_seen), len(observable), 1)
        capacity = 1 << max(6, math.ceil(math.log2(need * headroom)))
    x, z, num_qubits = observable.x, observable.z, observable.num_qubits
    ncoeffs = len(observable)

    def f(params, coeffs=None):
        obs = observable
        if coeffs is not None:
            if jnp.shape(coeffs) != (ncoeffs,):
                raise ValueError(f"coeffs must have shape ({ncoeffs},) (one per observable term), "
                                 f"got {jnp.shape(coeffs)}")
            obs = PauliSum(x, z, coeffs, num_qubits)
        return expectation(circuit, obs, params, state=state, truncation=truncation, method=method,
                           capacity=capacity, return_stats=return_stats)

    def refit(params):
        if method != "pauli":
            return f
        again = expectation_fn(circuit, observable, params, initial_capacity=capacity, **settings)
        return again if again.capacity > capacity else f

    f.capacity = capacity
    f.refit = refit
    # the usual step of an optimizer loop, compiled once (on CPUs with the engine's compiler options)
    options = CPU_COMPILER_OPTIONS if devices.backend() == "cpu" else None
    f.value_and_grad = jax.jit(jax.value_and_grad(f, has_aux=return_stats), compiler_options=options)
    f.__doc__ = f"<{observable!r}> after a {circuit.num_qubits}-qubit circuit; capacity {capacity}."
    return f
