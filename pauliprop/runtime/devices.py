"""The device a computation runs on: JAX's default device where one is set (`with jax.default_device(d):`,
or the jax_default_device setting), else the first device of JAX's default backend; and its platform,
which picks the engine (the native CPU engine, XLA's passes, or the GPU's kernels) and sizes the buffers.
Every part of pauliprop asks here, so a caller that sets the default device (pauliprop.Estimator's
`device`) moves the whole computation there."""

from __future__ import annotations

import jax

_PLATFORMS = {"cuda": "gpu", "rocm": "gpu"}  # device platforms by the names jax.default_backend() uses


def device() -> jax.Device:
    """The device computations run on now."""
    chosen = jax.config.jax_default_device
    if chosen is None:
        return jax.devices()[0]
    if isinstance(chosen, str):  # a platform's name
        return jax.devices(chosen)[0]
    return chosen


def backend() -> str:
    """The platform computations run on now: 'cpu', 'gpu' or 'tpu' (as jax.default_backend() names them)."""
    if jax.config.jax_default_device is None:
        return jax.default_backend()
    platform = device().platform
    return _PLATFORMS.get(platform, platform)


def resolve(given) -> jax.Device:
    """A device from a jax.Device or a platform's name ('cpu', 'gpu', 'cuda', 'tpu'), refused by name where
    this process has none."""
    if isinstance(given, jax.Device):
        return given
    if not isinstance(given, str):
        raise TypeError(f"device must be a jax.Device or a platform's name such as 'cpu' or 'gpu', got {given!r}")
    try:
        return jax.devices(given)[0]
    except RuntimeError as error:
        raise ValueError(f"device {given!r}: this process has no such device ({error})") from None
