"""pauliprop: a differentiable Pauli-path estimator on JAX.

Estimates <psi|H|psi>, psi = U|state>, by propagating H backward through U as packed Pauli words
with coefficients (Clifford conjugation, rotation splitting, duplicate merging, truncation), then
taking the overlap with the initial state. See README.md, ARCHITECTURE.md and DESIGN.md.

  circuits/     the front end: the gate table, the circuit builder, OpenQASM/Qiskit import
  algebra/      packed Pauli words, PauliSum, Clifford maps on words, overlaps with product states
  propagation/  the Pauli-path engine: lowering, steps, the loop, merge, truncation, reverse mode
  statevector/  the exact state-vector backend: simulator, fusion, sharding, adjoint gradients
  models/       Hamiltonians, ansatz circuits, the 127-qubit kicked Ising
  runtime/      JAX-level support: the compilation cache, prefix sums, the batching rule
  cli.py        the `pauliprop` command
  estimator.py  pp.Estimator: Qiskit's Estimator primitive (BaseEstimatorV2) on pauliprop (needs Qiskit)

Precision: coefficients follow JAX's default float (float32, or float64 with jax_enable_x64); the
exactness claims (agreement with the state vector to 1e-10) hold under jax_enable_x64, which the
command-line tool and benchmarks turn on. The one JAX setting importing pauliprop changes is the
persistent compilation cache (pauliprop/runtime/compilation.py; PAULIPROP_NO_CACHE=1 turns that off).
"""

from .runtime import compilation

compilation.enable()  # JAX's persistent compilation cache (pauliprop/runtime/compilation.py)

from . import statevector  # noqa: E402
from .algebra.overlap import overlap  # noqa: E402
from .algebra.paulisum import PauliSum  # noqa: E402
from .circuits.circuit import Circuit, Instruction, Param  # noqa: E402
from .circuits.gates import GATES, GateDef  # noqa: E402
from .models import ansatz, hamiltonians  # noqa: E402
from .propagation import sharded  # noqa: E402
from .propagation.objective import expectation_fn  # noqa: E402
from .propagation.propagate import CPU_COMPILER_OPTIONS, PropagationStats, expectation, propagate  # noqa: E402
from .propagation.shared import expectations  # noqa: E402
from .propagation.truncation import Truncation  # noqa: E402
from .statevector import adjoint as statevector_adjoint  # noqa: E402
from .statevector import sharding  # noqa: E402

__all__ = ["CPU_COMPILER_OPTIONS", "Circuit", "Instruction", "Param", "GATES", "GateDef", "PauliSum",
           "PropagationStats", "Truncation", "ansatz", "expectation", "expectation_fn", "expectations", "hamiltonians", "overlap", "propagate", "sharded", "sharding",
           "statevector", "statevector_adjoint"]
__version__ = "0.1.0"


def __getattr__(name):
    # pp.Estimator, Qiskit's Estimator primitive (pauliprop/estimator.py), is loaded on first use:
    # it subclasses a Qiskit class, and importing pauliprop must not need Qiskit (an extra)
    if name == "Estimator":
        from .estimator import Estimator

        return Estimator
    raise AttributeError(f"module 'pauliprop' has no attribute {name!r}")
