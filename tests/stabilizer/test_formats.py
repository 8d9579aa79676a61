"""Stim's result formats (stabilizer/formats.py) equal Stim's own writer byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stabilizer.formats import FORMATS, write_shot_data

stim = pytest.importorskip("stim")


@settings(max_examples=60)
@given(st.integers(1, 3).map(lambda g: 64 * g), st.integers(1, 700), st.sampled_from([0.0, 0.002, 0.3, 1.0]),
       st.integers(0, 2**32 - 1), st.booleans())
def test_every_format_equals_stims_writer(tmp_path_factory, shots, width, p, seed, measurements):
    bits = np.random.default_rng(seed).random((shots, width)) < p
    counts = (width, 0, 0) if measurements else (0, width - width // 4, width // 4)
    path = tmp_path_factory.mktemp("shots") / "data"
    for fmt in FORMATS:
        stim.write_shot_data_file(data=bits, path=str(path), format=fmt, num_measurements=counts[0],
                                  num_detectors=counts[1], num_observables=counts[2])
        assert write_shot_data(bits, fmt, *counts) == path.read_bytes(), fmt


def test_bad_shapes_and_formats_name_the_cause():
    with pytest.raises(ValueError, match="multiple of 64"):
        write_shot_data(np.zeros((10, 3), bool), "ptb64")
    with pytest.raises(ValueError, match="unknown result format 'b9'"):
        write_shot_data(np.zeros((1, 3), bool), "b9")
    with pytest.raises(ValueError, match="column counts"):
        write_shot_data(np.zeros((1, 3), bool), "dets", 1, 1, 0)
