"""Ready-made problems built from the front end and the algebra: hamiltonians (TFIM, Heisenberg/XXZ,
MaxCut, OpenFermion terms, and the lattices they take), ansatz (hardware-efficient layers, QAOA) and
kicked_ising_127 (IBM's 127-qubit kicked Ising on the heavy-hex lattice, with the published
reference values). The kicked Ising's names are this package's too, as `models.kicked_ising(...)`.

Imports circuits and algebra only: a model is a Circuit or a PauliSum, evaluated by whichever
backend the caller picks.
"""

from . import ansatz, hamiltonians
from .kicked_ising_127 import (EXACT_MZ_5_STEPS, MIX_Z62_20_STEPS, SPD_Z62_20_STEPS, heavy_hex_127, kicked_ising,
                               kicked_ising_parametrized, magnetization, single_z)

__all__ = ["EXACT_MZ_5_STEPS", "MIX_Z62_20_STEPS", "SPD_Z62_20_STEPS", "ansatz", "hamiltonians", "heavy_hex_127",
           "kicked_ising", "kicked_ising_parametrized", "magnetization", "single_z"]
