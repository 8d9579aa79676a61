"""Ansatz builders (pauliprop/models/ansatz.py): parameter order as documented, QAOA equal to its definition."""

from __future__ import annotations

import numpy as np
import pytest

import pauliprop as pp
from pauliprop.models import ansatz as A
from pauliprop.models import hamiltonians as H


def test_hardware_efficient_lays_out_its_parameters_layer_by_layer():
    c = A.hardware_efficient(3, layers=2, rotations=("ry", "rz"), entangler="rzz", periodic=True)
    want, k = [], 0
    for _ in range(2):
        for r in ("ry", "rz"):
            for q in range(3):
                want.append((r, (q,), (pp.Param(k),)))
                k += 1
        for e in [(0, 1), (1, 2), (2, 0)]:
            want.append(("rzz", e, (pp.Param(k),)))
            k += 1
    for r in ("ry", "rz"):
        for q in range(3):
            want.append((r, (q,), (pp.Param(k),)))
            k += 1
    assert [(i.name, i.qubits, i.args) for i in c.instructions] == want
    assert c.num_params == k == 24
    plain = A.hardware_efficient(4, layers=3, rotations=("rx",), entangler="cz", final_rotations=False)
    assert plain.num_params == 12 and sum(i.name == "cz" for i in plain.instructions) == 9


def _qaoa_state(n, edges, w, gammas, betas):
    """|gamma, beta> = prod_l exp(-i beta_l sum X) exp(-i gamma_l C) |+>^n, straight from the definition."""
    z = np.arange(2**n)
    bits = (z[:, None] >> np.arange(n)) & 1
    cut = sum(wi * (bits[:, a] != bits[:, b]) for (a, b), wi in zip(edges, w))
    psi = np.full(2**n, 2 ** (-n / 2), complex)
    for g, b in zip(gammas, betas):
        psi = np.exp(-1j * g * cut) * psi
        rx = np.array([[np.cos(b), -1j * np.sin(b)], [-1j * np.sin(b), np.cos(b)]])
        t = psi.reshape([2] * n)
        for q in range(n):  # qubit q is axis n-1-q of the C-ordered reshape
            t = np.moveaxis(np.tensordot(rx, t, axes=([1], [n - 1 - q])), 0, n - 1 - q)
        psi = t.reshape(-1)
    return psi, cut


def test_qaoa_expectation_equals_the_definition():
    rng = np.random.default_rng(1)
    n, edges = 5, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 0), (0, 2)]
    w = rng.uniform(0.5, 1.5, len(edges))
    params = rng.uniform(-1, 1, 4)
    c, cost = A.qaoa(edges, layers=2, weights=w), H.maxcut(edges, weights=w)
    psi, cut = _qaoa_state(n, edges, w, params[0::2], params[1::2])
    want = float(np.sum(np.abs(psi) ** 2 * cut))
    assert c.num_params == 4
    assert abs(float(pp.expectation(c, cost, params)) - want) < 1e-10
    assert abs(float(pp.expectation(c, cost, params, method="statevector")) - want) < 1e-10


@pytest.mark.parametrize("call, message", [
    (lambda: A.hardware_efficient(3, 1, rotations=("rq",)), "rotations must be a non-empty list"),
    (lambda: A.hardware_efficient(3, 1, entangler="swap"), "entangler must be one of"),
    (lambda: A.hardware_efficient(3, -1), "layers must be a non-negative int"),
    (lambda: A.qaoa([(0, 1)], 0), "layers must be a positive int"),
    (lambda: A.qaoa([(0, 1)], 1, weights=[1, 2]), "2 weights for 1 edges"),
    (lambda: A.qaoa([(0, 5)], 1, num_qubits=3), "edge 0: qubit 5 out of range"),
])
def test_bad_input_names_the_cause(call, message):
    with pytest.raises(ValueError, match=message):
        call()
