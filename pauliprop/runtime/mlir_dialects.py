"""Pallas's Triton lowering without three failed imports for every op it builds.

jaxlib's MLIR bindings, for each op or type they hand back to Python, first make sure the Python module of its
dialect is loaded: they import `<prefix>.<dialect>` under each registered prefix (jaxlib.mlir.dialects,
jaxlib.mosaic.python, jax.jaxlib.mosaic.python) until one is found, and they remember only a success. The
Triton dialect ("tt") has no module there (its ops come with jaxlib.triton), so each op of a Pallas kernel cost
three failed imports, each a search of sys.path: 5,955 for the 2D Ising 8x8's GPU program (jax 0.10 and 0.11).
`register()` appends one last prefix, this module, under which an empty module of each such dialect is found:
the first lookup succeeds and the bindings remember it. The lowered programs are unchanged, character for
character (tests/pauliprop/runtime/test_mlir_dialects.py)."""

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


def register() -> bool:
    """Append this module's prefix to the bindings' search (once a process); whether it is there."""
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
