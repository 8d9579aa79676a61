"""Overlaps <psi|P|psi> of propagated words with product initial states.

Pauli eigenstates (0, 1, +, -, r, l per qubit) reduce to bit masks: <0|P|0> = 1 iff P has no X/Y,
<+|P|+> = 1 iff no Y/Z, and eigenvalue -1 states add a sign per matching site. Any other product
state is an (n, 3) array of Bloch vectors: <psi|P|psi> = prod_q r_q[P_q].
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import words
from .paulisum import PauliSum

# character -> (basis: 0 Z, 1 X, 2 Y; eigenvalue -1?)
_EIGENSTATES = {"0": (0, False), "1": (0, True), "+": (1, False), "-": (1, True), "r": (2, False), "l": (2, True)}
_BLOCH = {"0": (0, 0, 1), "1": (0, 0, -1), "+": (1, 0, 0), "-": (-1, 0, 0), "r": (0, 1, 0), "l": (0, -1, 0)}


def parse_state(state, num_qubits: int):
    """('eigen', masks) for Pauli-eigenstate strings, ('bloch', (n, 3) array) for Bloch vectors."""
    if isinstance(state, str):
        s = state.strip()
        if len(s) == 1:
            s = s * num_qubits
        if len(s) != num_qubits:
            raise ValueError(f"state '{state}' has {len(s)} characters but the circuit has {num_qubits} qubits "
                             "(use one character per qubit, or a single character for all)")
        bad = sorted(set(s) - set(_EIGENSTATES))
        if bad:
            raise ValueError(f"unsupported state character(s) {bad} in state '{state}': use 0 1 + - r l per qubit, "
                             "or an (n, 3) array of Bloch vectors")
        masks = {k: {} for k in ("z", "x", "y", "minus")}
        for q, ch in enumerate(s):
            basis, minus = _EIGENSTATES[ch]
            masks["zxy"[basis]][q] = "X"
            if minus:
                masks["minus"][q] = "X"
        packed = {k: words.pack([v], num_qubits)[0][0] for k, v in masks.items()}
        return "eigen", packed
    arr = np.asarray(state, dtype=float)
    if arr.shape != (num_qubits, 3):
        raise ValueError(f"unsupported state {type(state).__name__} of shape {arr.shape}: expected a string or an "
                         f"({num_qubits}, 3) array of Bloch vectors")
    if not np.all(np.isfinite(arr)) or np.any(np.linalg.norm(arr, axis=1) > 1 + 1e-9):
        raise ValueError("Bloch vectors must be finite with norm <= 1")
    return "bloch", arr


def bloch_vectors(state, num_qubits: int) -> np.ndarray:
    """(n, 3) Bloch vectors of any accepted state description."""
    kind, data = parse_state(state, num_qubits)
    if kind == "bloch":
        return data
    s = state.strip() * (num_qubits if len(state.strip()) == 1 else 1)
    return np.array([_BLOCH[ch] for ch in s], dtype=float)


def word_overlaps(x, z, state, num_qubits: int):
    """<psi|P_t|psi> for every packed word (T, W) -> (T,) float."""
    kind, data = parse_state(state, num_qubits)
    if kind == "eigen":
        mz, mx, my, minus = (jnp.asarray(data[k]) for k in ("z", "x", "y", "minus"))
        ok = jnp.all(((x & mz) == 0) & ((z & mx) == 0) & (((x ^ z) & my) == 0), axis=-1)
        parity = words.popcount((x | z) & minus).sum(-1) & 1
        return jnp.where(ok, 1.0 - 2.0 * parity, 0.0)
    # generic product state: each qubit's factors for I, X, Z, Y
    return table_overlaps(x, z, jnp.asarray(overlap_table(data, num_qubits, x.shape[-1])))


def overlap_table(state, num_qubits: int, num_lanes: int) -> np.ndarray:
    """(32 W, 4) factors <psi_q| P |psi_q> of each qubit's state for the codes I, X, Z, Y (host)."""
    r = bloch_vectors(state, num_qubits)
    table = np.zeros((words.LANE_BITS * num_lanes, 4))
    table[:, 0] = 1.0
    table[:num_qubits, 1], table[:num_qubits, 2], table[:num_qubits, 3] = r[:, 0], r[:, 2], r[:, 1]
    return table


def table_overlaps(x, z, table):
    """<psi| P |psi> of every packed word (T, W) -> (T,) for a product state given by its overlap_table."""
    shifts = jnp.arange(words.LANE_BITS, dtype=jnp.uint32)
    out = jnp.ones(x.shape[:-1], table.dtype)
    for lane in range(x.shape[-1]):
        xb, zb = ((x[..., lane, None] >> shifts) & 1) != 0, ((z[..., lane, None] >> shifts) & 1) != 0
        rows = table[lane * words.LANE_BITS:(lane + 1) * words.LANE_BITS]
        # each site's factor by selects, not a gather of the table (which compiles slower, inside a loop most)
        site = jnp.where(xb, jnp.where(zb, rows[:, 3], rows[:, 1]), jnp.where(zb, rows[:, 2], rows[:, 0]))
        out = out * jnp.prod(site, axis=-1)
    return out


def overlap(obs: PauliSum, state="0"):
    """<psi| obs |psi> for a product state psi (see `parse_state` for the accepted forms)."""
    vals = word_overlaps(jnp.asarray(obs.x), jnp.asarray(obs.z), state, obs.num_qubits)
    return jnp.sum(jnp.asarray(obs.coeffs) * vals.astype(jnp.asarray(obs.coeffs).dtype))
