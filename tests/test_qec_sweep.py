"""experiments/qec_sweep.py turns a frame simulator's packed measurement flips (cuStabilizer's layout:
(measurements, shot bytes)) into the detection events and observable flips a sinter user needs, as
Stim's own frame simulator computes them from the same frames."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

stim = pytest.importorskip("stim", reason="the sweep's circuits are Stim's (pip install -e '.[test]')")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import qec_sweep  # noqa: E402


# a measurement whose noiseless value is 1: its flips are not its outcomes (the reference sample's part)
FLIPPED = "X 0 1\nX_ERROR(0.2) 0\nM 0 1\nDETECTOR rec[-2]\nDETECTOR rec[-1]\nOBSERVABLE_INCLUDE(0) rec[-2]"


@pytest.mark.parametrize("d, p, shots", [(3, 1e-2, 1000), (5, 3e-3, 333), (None, None, 500)])  # 333: a partial byte
def test_detections_from_flips_equal_the_frame_simulators_own(d, p, shots):
    c = qec_sweep.circuit(d, p) if d else stim.Circuit(FLIPPED)
    sim = stim.FlipSimulator(batch_size=shots, num_qubits=c.num_qubits, seed=7)
    sim.do(c)
    flips = sim.get_measurement_flips(bit_packed=True)
    assert flips.shape == (c.num_measurements, (shots + 7) // 8)  # cuStabilizer's layout
    dets, obs = qec_sweep.detections_from_flips(c, flips, shots)
    want_dets = np.packbits(sim.get_detector_flips().T, axis=1, bitorder="little")
    want_obs = np.packbits(sim.get_observable_flips().T, axis=1, bitorder="little")
    assert dets.shape == (shots, (c.num_detectors + 7) // 8) and dets.dtype == np.uint8
    np.testing.assert_array_equal(dets, want_dets)
    np.testing.assert_array_equal(obs, want_obs)
    assert 0 < np.unpackbits(dets).mean() < 0.5  # noise made some detection events, not all
