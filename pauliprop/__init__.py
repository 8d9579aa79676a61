"""pauliprop: a differentiable Pauli-path estimator on JAX.

Estimates <psi|H|psi>, psi = U|state>, by propagating H backward through U as packed Pauli words
with coefficients (Clifford conjugation, rotation splitting, duplicate merging, truncation), then
taking the overlap with the initial state. See README.md and DESIGN.md.

Precision: coefficients follow JAX's default float (float32, or float64 with jax_enable_x64); the
exactness claims (agreement with the state vector to 1e-10) hold under jax_enable_x64, which the
command-line tool and benchmarks turn on. The one JAX setting importing pauliprop changes is the
persistent compilation cache (pauliprop/runtime/compilation.py; PAULIPROP_NO_CACHE=1 turns that off).
"""

from .runtime import compilation

compilation.enable()  # JAX's persistent compilation cache (pauliprop/runtime/compilation.py)

from . import sharded, statevector  # noqa: E402
from .models import ansatz, hamiltonians
from .circuits import gates  # noqa: E402 - pp.gates: the gate table module, which stabilizer reads too
from .circuits.circuit import Circuit, Instruction, Param
from .circuits.gates import GATES, GateDef
from .objective import expectation_fn
from .algebra.overlap import overlap
from .algebra.paulisum import PauliSum
from .propagate import CPU_COMPILER_OPTIONS, PropagationStats, expectation, propagate
from .shared import expectations
from .statevector import adjoint as statevector_adjoint
from .statevector import sharding
from .truncation import Truncation

__all__ = ["CPU_COMPILER_OPTIONS", "Circuit", "Instruction", "Param", "GATES", "GateDef", "PauliSum",
           "PropagationStats", "Truncation", "ansatz", "expectation", "expectation_fn", "expectations", "hamiltonians", "overlap", "propagate", "sharded", "sharding",
           "statevector", "statevector_adjoint"]
__version__ = "0.1.0"
