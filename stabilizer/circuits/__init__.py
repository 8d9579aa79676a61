"""The front end: Stim text to op tables.

  circuit  Stim's circuit format: `Circuit`, `CircuitInstruction`, `GateTarget`, `CircuitError`; the
           instruction table (INSTRUCTIONS), parsing, validation, printing
  program  the lowering: a circuit as op tables that one `lax.scan` runs (gate windows on disjoint
           qubits numbered in the gate catalogue, measurements rotated to Z, noise as Pauli events,
           REPEAT blocks as loops)

The unitary gates come from pauliprop's shared gate table (`pauliprop.circuits.gates`). Imports
nothing else of stabilizer; the tableau and the frames run what it lowers.
"""
