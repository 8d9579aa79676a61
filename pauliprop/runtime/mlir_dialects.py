"""Pallas's Triton lowering without the per-process costs it need not pay: three failed imports for every op it
builds, and an import of Mosaic GPU before its first kernel.

jaxlib's MLIR bindings, for each op or type they hand back to Python, first make sure the Python module of its
dialect is loaded: they import `<prefix>.<dialect>` under each registered prefix (jaxlib.mlir.dialects,
jaxlib.mosaic.python, jax.jaxlib.mosaic.python) until one is found, and they remember only a success. The
Triton dialect ("tt") has no module there (its ops come with jaxlib.triton), so each op of a Pallas kernel cost
three failed imports, each a search of sys.path: 5,955 for the 2D Ising 8x8's GPU program (jax 0.10 and 0.11).
`register()` appends one last prefix, this module, under which an empty module of each such dialect is found:
the first lookup succeeds and the bindings remember it.

Pallas's GPU lowering of a call that carries Triton's CompilerParams first imports Mosaic GPU (0.2 s on a 2-core
AMD EPYC, jax 0.10 and 0.11: absl, xml.dom and some forty modules) only to find the call is not Mosaic's, unless a
lowering rule is registered for those params' class. `register()` registers Triton's own lowering there.

The lowered programs are unchanged, character for character (tests/pauliprop/runtime/test_mlir_dialects.py)."""

from __future__ import annotations

import sys
import types

DIALECTS = ("tt",)  # dialects whose ops Pallas builds and whose Python module no prefix holds


def _globals():
    """The bindings' registry of dialect search prefixes (None where this jaxlib has none)."""
    try:
        from jaxlib.mlir._mlir_libs import _mlir
    except ImportError:
        return None
    registry = getattr(_mlir, "globals", None)
    return registry if hasattr(registry, "append_dialect_search_prefix") else None


def _triton_lowering(ctx, *in_nodes, **params):
    """Pallas's Triton lowering of a pallas_call, imported when the first kernel is lowered."""
    from jax._src.pallas.triton import pallas_call_registration

    return pallas_call_registration.pallas_call_lowering(ctx, *in_nodes, **params)


def _register_triton_rule() -> bool:
    """Triton's lowering as the rule for its CompilerParams (where this jax looks such rules up); whether it is."""
    try:
        from jax._src.pallas import core as pallas_core
        from jax._src.pallas.triton import core as triton_core
    except ImportError:
        return False
    if not hasattr(pallas_core, "register_lowering_rule") or not hasattr(pallas_core, "get_lowering_rule"):
        return False
    if pallas_core.get_lowering_rule(triton_core.CompilerParams, "gpu") is None:
        pallas_core.register_lowering_rule(triton_core.CompilerParams, _triton_lowering, "gpu")
    return True


def register() -> bool:
    """Append this module's prefix to the bindings' search and register Triton's lowering rule (once a
    process); whether the prefix is there."""
    _register_triton_rule()
    registry = _globals()
    if registry is None:
        return False
    for dialect in DIALECTS:
        name = f"{__name__}.{dialect}"
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name, f"an empty stand-in for the MLIR dialect {dialect!r}'s "
                                                       "Python module (pauliprop.runtime.mlir_dialects)")
    if __name__ not in registry.dialect_search_modules:
        registry.append_dialect_search_prefix(__name__)
    return True
