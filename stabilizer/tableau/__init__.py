"""The tableau engine: the packed inverse tableau, its Pallas kernels, and `TableauSimulator`.

  tableau    the bit-packed inverse tableau and its pure rules: gate windows prepended, Z measurements
             (one collapse each, or blocks of MEASURE_BLOCK: a plan of the measured rows, then an
             apply over all rows), a lowered program as one scan, the noiseless reference record
  kernels    the Pallas kernels of the GPU hot loops beside those rules (prepend_rows, collapse_rows,
             plan_rows, replay_inputs, apply_rows), the kernel mode every runner reads (STABILIZER_KERNEL), and the
             word helpers the frames share (pack, lane_mask)
  simulator  `TableauSimulator`: Stim's interactive simulator on the tableau

Imports stabilizer.circuits (the instructions and the lowering), never the frames. The names of
tableau.py are this package's too, as `stabilizer.tableau.identity(...)`; the modules read their own
globals, so patch those (in stabilizer.tableau.tableau, stabilizer.tableau.kernels), not the copies
here.
"""

from .simulator import TableauSimulator
from .tableau import (BATCH_MIN_ACTIVE, MEASURE_BLOCK, WORD, Tableau, flip_signs, grow, identity, measure_kickback_z,
                      measure_many_z, measure_z, peek_z, prepend, product_phase, reference_record, run_program)

__all__ = ["BATCH_MIN_ACTIVE", "MEASURE_BLOCK", "WORD", "Tableau", "TableauSimulator", "flip_signs", "grow", "identity",
           "measure_kickback_z", "measure_many_z", "measure_z", "peek_z", "prepend", "product_phase",
           "reference_record", "run_program"]
