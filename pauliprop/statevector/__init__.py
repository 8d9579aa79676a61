"""The exact state-vector backend: the reference for every estimate, and the exact method.

  simulator  simulate, expectation, sample: a lax.scan over the circuit's gate table, or a fusion plan
  passes     one pass over the state: a gate's matrix, a k-qubit block as sums of slices or a GEMM
  fusion     the circuit as a short plan of passes (dense blocks, diagonal tables, swaps relabeled)
  sharding   the same plans on 2^G devices (shard_map; all-to-all swaps of global and local qubits)
  adjoint    exact energies and gradients by adjoint differentiation (three states of memory)

Imports circuits, algebra and runtime (the device's memory, which bounds state sizes), never
propagation (which calls it for method="statevector"). The names of simulator and passes are this
package's, as `pp.statevector.simulate(...)`.
"""

from ..runtime.memory import device_memory_bytes
from .passes import (ELEMENTWISE_WIDTH, MAX_ELEMENTWISE_WIDTH, apply_block, apply_matrix, block_layout, gate_matrix,
                     gemm_in_place, is_fixed, unitary_gate)
from .simulator import (GateTable, check_size, expectation, gate_rows, gate_step, gate_table, index_type, initial_state,
                        observable_masks, padded_length, parameter_values, pauli_expectations, pauli_times, product_kets,
                        product_state, reference_start, require_params, run_gates, run_plan, sample, simulate)

__all__ = ["ELEMENTWISE_WIDTH", "MAX_ELEMENTWISE_WIDTH", "GateTable", "apply_block", "apply_matrix", "block_layout",
           "check_size", "device_memory_bytes", "expectation", "gate_matrix", "gate_rows", "gate_step", "gate_table",
           "gemm_in_place", "index_type", "initial_state", "is_fixed", "observable_masks", "padded_length",
           "parameter_values", "pauli_expectations", "pauli_times", "product_kets", "product_state", "reference_start",
           "require_params", "run_gates", "run_plan", "sample", "simulate", "unitary_gate"]
