"""pauliprop/runtime/mlir_dialects.py: with register() called, lowering a Pallas kernel for GPUs looks for a dialect's
module once, not once an op, does not import Mosaic GPU, and gives the same program, character for character. Each
side runs in a fresh process (the bindings' registry and the imported modules are process-wide)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pauliprop.runtime import mlir_dialects

# A kernel of loads, arithmetic, a loop and stores, lowered for CUDA (no GPU needed: the lowering is Python's);
# prints the lowered text and the imports of modules that were not found.
_SCRIPT = r"""
import builtins, json, sys
import jax, jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
if sys.argv[1] == "register":
    from pauliprop.runtime import mlir_dialects
    assert mlir_dialects.register()
missing, real_import = [], builtins.__import__
def counting(name, *args, **kw):
    try:
        return real_import(name, *args, **kw)
    except ModuleNotFoundError:
        missing.append(name)
        raise
builtins.__import__ = counting
def kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = lax.fori_loop(0, 4, lambda i, a: jnp.where(a > i, a * 3 + 1, a ^ i), x)
f = jax.jit(lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((256,), jnp.int32),
                                     compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1))(x))
text = f.trace(jax.ShapeDtypeStruct((256,), jnp.int32)).lower(lowering_platforms=("cuda",)).as_text()
print(json.dumps({"text": text, "missing": missing, "mosaic_gpu": "jax._src.pallas.mosaic_gpu.core" in sys.modules}))
"""


def _lowered(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, mode], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_registered_the_lowering_makes_no_failed_dialect_import_and_is_unchanged():
    if mlir_dialects._globals() is None:
        pytest.skip("this jaxlib's MLIR bindings have no registry of dialect search prefixes")
    plain, registered = _lowered("plain"), _lowered("register")
    assert "__gpu$xla.gpu.triton" in plain["text"]
    assert registered["text"] == plain["text"]
    dialect_misses = [name for name in plain["missing"] if name.endswith(".tt")]
    assert len(dialect_misses) > 10  # what register() is for: a miss for each op (if jaxlib fixes it, drop this)
    once = [name for name in registered["missing"] if name.endswith(".tt")]  # the first lookup, then remembered
    assert len(once) == len(set(once)) <= 3


def test_registered_the_triton_lowering_does_not_import_mosaic_gpu():
    plain, registered = _lowered("plain"), _lowered("register")
    assert plain["mosaic_gpu"]  # what register() is for: Pallas imports Mosaic GPU to decline the call
    assert not registered["mosaic_gpu"]
    assert registered["text"] == plain["text"]


def test_register_is_idempotent():
    if mlir_dialects._globals() is None:
        pytest.skip("this jaxlib's MLIR bindings have no registry of dialect search prefixes")
    assert mlir_dialects.register() and mlir_dialects.register()
    prefixes = list(mlir_dialects._globals().dialect_search_modules)
    assert prefixes.count(mlir_dialects.__name__) == 1
    assert f"{mlir_dialects.__name__}.tt" in sys.modules
