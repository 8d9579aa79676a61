"""The Pauli-path engine: the observable propagated backward through the circuit as packed words.

  program     lowering: a Circuit becomes a Program, one row per gate (Clifford tables, rotation
              generators, channel factors), and the observable's backward light cone
  schedule    the rows cut into steps (Clifford runs as one map, layers of rotations, channels,
              merges) and the loop's units, in tables padded to bucketed lengths
  truncation  the rules (max_weight, min_abs_coeff, max_terms, max_sins) and the keep-largest cut
  merge       rotations by pairs, the full merge of duplicate words, compaction of the buffer
  pairing     each turning word finds its partner P xor G through a hash table (no sort)
  tiled       the loop of concrete calls: buffers sized once, passes that follow the live terms
  engine      the loop under a trace: one lax.while_loop (or scan) over the units, a fixed capacity
  adjoint     its reverse mode: segment checkpoints and each unit's transpose
  propagate   the entry points (propagate, expectation): which loop runs, buffer sizes, compiled programs
  objective   a params -> <H> function with its capacity fixed once, for variational loops
  shared      several observables through one propagation
  sharded     the terms sharded over the devices of a mesh

Imports algebra, circuits, runtime and statevector (expectation(method="statevector") calls it).
"""
