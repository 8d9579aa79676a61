"""Stim's result formats (doc/result_formats.md in quantumlib/Stim): shot data as bytes.

`write_shot_data(bits, fmt, ...)` turns a (shots, bits) bool array into the bytes `stim sample` and
`stim detect` write for `--out_format fmt`, so that pipelines built on Stim's files keep working:

  01     a line of '0'/'1' a shot
  b8     each shot's bits packed little-endian into whole bytes
  r8     each shot as run lengths: a byte per run of zeros before a one (255: 255 zeros, no one yet),
         the shot ending with an implied one after its last bit
  hits   a line a shot: the indices of its ones, comma separated
  dets   a line a shot: "shot" then " M3" / " D3" / " L3" for each one (measurement, detector, observable)
  ptb64  groups of 64 shots: for each bit, 8 bytes whose bit k is shot k of the group (shots % 64 == 0)

Tested byte for byte against `stim.write_shot_data_file`.
"""

from __future__ import annotations

import numpy as np

FORMATS = ("01", "b8", "r8", "hits", "dets", "ptb64")


def write_shot_data(bits, fmt: str, num_measurements: int = 0, num_detectors: int = 0,
                    num_observables: int = 0) -> bytes:
    """The bytes of `bits` (shots, M + D + L) in Stim's format `fmt`. The counts name the columns
    for "dets" (M, D, L prefixes); other formats need only the bits."""
    bits = np.asarray(bits, dtype=bool)
    if bits.ndim != 2:
        raise ValueError(f"shot data must be (shots, bits), got shape {bits.shape}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown result format {fmt!r} (one of {', '.join(FORMATS)})")
    shots, width = bits.shape
    if fmt == "01":
        text = np.full((shots, width + 1), ord("\n"), np.uint8)
        text[:, :width] = np.where(bits, ord("1"), ord("0"))
        return text.tobytes()
    if fmt == "b8":
        return np.packbits(bits, axis=1, bitorder="little").tobytes()
    if fmt == "ptb64":
        if shots % 64:
            raise ValueError(f"ptb64 writes groups of 64 shots; {shots} shots is not a multiple of 64")
        groups = bits.reshape(shots // 64, 64, width).transpose(0, 2, 1)  # (group, bit, shot in group)
        return np.packbits(groups, axis=2, bitorder="little").tobytes()
    if fmt == "r8":
        return b"".join(_run_lengths(row) for row in bits)
    if fmt == "hits":
        return "".join(",".join(map(str, np.flatnonzero(row))) + "\n" for row in bits).encode()
    names = _dets_names(width, num_measurements, num_detectors, num_observables)
    return "".join("shot" + "".join(" " + names[i] for i in np.flatnonzero(row)) + "\n" for row in bits).encode()


def _run_lengths(row: np.ndarray) -> bytes:
    """r8 of one shot: the zeros before each one, and before the implied one after the last bit."""
    ones = np.flatnonzero(row)
    gaps = np.diff(np.concatenate([[-1], ones, [row.shape[0]]])) - 1
    out = bytearray()
    for g in gaps.tolist():
        out += b"\xff" * (g // 255) + bytes([g % 255])
    return bytes(out)


def _dets_names(width: int, m: int, d: int, obs: int) -> list[str]:
    if m + d + obs != width:
        raise ValueError(f"dets needs the column counts: {m} measurements + {d} detectors + {obs} observables "
                         f"!= {width} bits a shot")
    return [f"M{i}" for i in range(m)] + [f"D{i}" for i in range(d)] + [f"L{i}" for i in range(obs)]
