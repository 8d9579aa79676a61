"""Batches that share the engine's control flow.

The engine picks a branch per gate from counts (which room holds the splitting words, whether a cut
is needed). Under a plain `jax.vmap` a batched branch index turns every `lax.cond`/`lax.switch` into
a select that runs all branches, so a batch of 32 parameter sets ran 20x slower than a loop of
single calls. `batched(fn)` gives `fn` its own vmap rule: the batch runs under a named axis and
`shared(x)` takes the maximum of a branch index (or any() of a predicate) over it, so the batch
takes one branch per gate, the one the most demanding member needs. Every such branch is valid for
the others: a larger room holds fewer words, a cut keeps everything when it has room
(`truncation.keep_largest`), an exact ordering is always exact.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
from jax import lax

_axes: list[str] = []  # the named batch axes being traced, innermost last
_sizes: list[int] = []
_names = itertools.count()


def shared(x):
    """x reduced over the batch being traced (max of an int index, any() of a bool); x outside one."""
    if not _axes:
        return x
    if x.dtype == jnp.bool_:
        return lax.pmax(x.astype(jnp.int32), tuple(_axes)) > 0
    return lax.pmax(x, tuple(_axes))


def batch_size() -> int:
    """Members of the batch being traced (1 outside one): what a buffer of one member costs times this."""
    out = 1
    for s in _sizes:
        out *= s
    return out


def batched(fn):
    """fn with a vmap rule that runs the batch under a named axis, so `shared` can reduce over it."""
    wrapped = jax.custom_batching.custom_vmap(fn)

    @wrapped.def_vmap
    def rule(axis_size, in_batched, *args):
        name = f"pauliprop_batch_{next(_names)}"
        in_axes = tuple(jax.tree_util.tree_map(lambda b: 0 if b else None, flags) for flags in in_batched)
        _axes.append(name)
        _sizes.append(int(axis_size))
        try:
            out = jax.vmap(fn, in_axes=in_axes, axis_name=name, axis_size=axis_size)(*args)
        finally:
            _axes.pop()
            _sizes.pop()
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return wrapped
