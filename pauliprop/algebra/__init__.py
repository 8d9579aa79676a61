"""The Pauli algebra on packed words: words (x and z bits in uint32 lanes; products, signs,
anticommutation, fingerprints), paulisum (PauliSum, a pytree of words and real coefficients, with
its Qiskit and Stim conversions), clifford (Clifford runs as symplectic maps on words) and overlap
(<psi|P|psi> of words with product states, and the accepted state descriptions).

Imports circuits (the Pauli matrices of the gate table) and runtime; propagation, statevector and
models build on it."""
