"""The front end: what to compute. The gate table (gates: one record per gate, read by every
backend and by stabilizer), the circuit builder (circuit: validated instructions, angles fixed or
`Param` references) and OpenQASM/Qiskit import (qasm, which builds through the class it is handed).

Imports nothing else of pauliprop; every other folder may import it."""
