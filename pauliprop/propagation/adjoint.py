"""Reverse mode of the propagation loop: segment checkpoints and each unit's transpose.

With its truncation decisions frozen, every unit of the loop maps the coefficient vector linearly.
`value_and_grad` runs the units forward in segments of `seg` units, keeping only the buffer at the
start of each segment; then, last segment first, it replays the segment keeping its units' inputs
and sweeps it backward: the cotangent of a unit's output coefficients becomes that of its input
(and of the parameters) by JAX's VJP of the unit's own function (merge, rotation, truncation), or,
for the diagonal units (Clifford runs, channels: each slot keeps its word, times a factor or 0),
by that factor, read off a second forward pass of the unit on unit coefficients with no rules.
The forward and the replay are the same loop body, so the engine compiles once per program.

Memory: (num_units / seg + seg) buffers of the capacity; `segment_length` picks seg near
sqrt(num_units).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

from . import engine, schedule
from .truncation import Limits


def segment_length(num_units: int) -> int:
    """A power of two near sqrt(num_units) (num_units is a power of two): seg * (num_units / seg)."""
    return 1 << ((max(num_units, 1).bit_length() - 1 + 1) // 2)


def _diagonal(fn):
    """Transpose of a unit that keeps every word in its slot: lam_in = factor * lam_out."""

    def back(b_in, u, lam, T, params, limits, cfg):
        out, _ = fn(b_in, u, T=T, params=params, limits=limits, cfg=cfg)
        ones = b_in._replace(coeffs=jnp.where(b_in.live, 1, 0).astype(b_in.coeffs.dtype))
        probe, _ = fn(ones, u, T=T, params=params, limits=Limits(), cfg=cfg)
        return jnp.where(out.live, probe.coeffs, 0) * lam, jnp.zeros_like(params)

    return back


def _by_vjp(fn):
    """Transpose of a unit by JAX's VJP of its function, in the coefficients and the parameters."""

    def back(b_in, u, lam, T, params, limits, cfg):
        def f(coeffs, p):
            out, _ = fn(b_in._replace(coeffs=coeffs), u, T=T, params=p, limits=limits, cfg=cfg)
            return jnp.where(out.live, out.coeffs, 0)

        _, pull = jax.vjp(f, b_in.coeffs, params)
        return pull(lam)

    return back


def _identity(b_in, u, lam, T, params, limits, cfg):
    return lam, jnp.zeros_like(params)


BACKWARD = {schedule.U_MERGE: _by_vjp(engine.merge_unit), schedule.U_CLIFFORD: _diagonal(engine.clifford_unit),
            schedule.U_SPLIT: _by_vjp(engine.split_unit),
            schedule.U_CHANNEL: _diagonal(engine.channel_unit), schedule.U_TRUNCATE: _by_vjp(engine.truncate_unit),
            schedule.U_NOOP: _identity}


def unit_backward(b_in, u, lam, T, params, limits, cfg):
    """(cotangent of unit u's input coefficients, of the parameters) from that of its output."""
    branches = [partial(BACKWARD[k] if k in cfg.units else _identity, T=T, params=params, limits=limits, cfg=cfg)
                for k in range(len(BACKWARD))]
    return lax.switch(T["u_kind"][u], [lambda lam, f=f: f(b_in, u, lam) for f in branches], lam)


def value_and_grad(T: dict, buf: engine.Buffer, params, limits: Limits, table, cfg: engine.Config, seg: int):
    """(value, final buffer, Progress, d value / d params, d value / d initial coefficients).

    The loop runs all T["u_kind"].shape[0] units (padding units are NOOPs), in cut mode."""
    total = T["u_kind"].shape[0]
    num_segments = total // seg

    def forward(carry, s):
        b, terms, peak = carry

        def one(i, c):
            b, terms, peak = c
            u = s * seg + i
            b, _ = engine.apply_unit(b, u, T, params, limits, cfg)
            count = jnp.sum(b.live).astype(jnp.int32)
            return b, terms.at[u].set(count), jnp.maximum(peak, count)

        end = lax.fori_loop(0, seg, one, (b, terms, peak))
        return end, b

    terms = jnp.zeros(total, jnp.int32)
    peak = jnp.sum(buf.live).astype(jnp.int32)
    (end, terms, peak), starts = lax.scan(forward, (buf, terms, peak), jnp.arange(num_segments))
    overlaps = engine.word_overlaps(end.x, end.z, table).astype(end.coeffs.dtype)
    lam = jnp.where(end.live, overlaps, 0)
    val = jnp.sum(jnp.where(end.live, end.coeffs, 0) * overlaps)

    def backward(carry, s):
        lam, dp = carry
        start = jax.tree_util.tree_map(lambda a: a[s], starts)

        def replay(b, i):
            nb, _ = engine.apply_unit(b, s * seg + i, T, params, limits, cfg)
            return nb, b

        _, inputs = lax.scan(replay, start, jnp.arange(seg))

        def back(c, i):
            lam, dp = c
            b_in = jax.tree_util.tree_map(lambda a: a[i], inputs)
            lam, d = unit_backward(b_in, s * seg + i, lam, T, params, limits, cfg)
            return (lam, dp + d), None

        (lam, dp), _ = lax.scan(back, (lam, dp), jnp.arange(seg), reverse=True)
        return (lam, dp), None

    (lam, dp), _ = lax.scan(backward, (lam, jnp.zeros_like(params)), jnp.arange(num_segments), reverse=True)
    progress = engine.Progress(jnp.asarray(total, jnp.int32), jnp.int32(0), terms, peak)
    return val, end, progress, dp, jnp.where(buf.live, lam, 0)
