"""`stabilizer` command: `sample` and `detect` as Stim's command line has them, on this package's samplers.

    stabilizer sample --shots 1000 --in circuit.stim --out_format 01 --seed 5
    stabilizer detect --shots 1000 --in circuit.stim --out dets.b8 --out_format b8 \\
        --obs_out obs.01 --obs_out_format 01

Flags take Stim's spelling (`--out_format`) or dashes (`--out-format`). The input is a Stim circuit
file (`str(stim.Circuit)`), stdin without --in; the output goes to --out, stdout without it, in one of
Stim's result formats (stabilizer/formats.py). With --seed the bits equal the Python samplers'
(`compile_sampler(c, seed=s).sample(shots)`, `compile_detector_sampler(c, seed=s).sample(...)`).
Bad input is one line on stderr naming the cause, and a non-zero exit.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .circuits.circuit import Circuit
from .formats import FORMATS, write_shot_data
from .frames.sampler import compile_detector_sampler, compile_sampler

BLOCK = 4096  # shots unpacked and written at a time (the sampler's output stays bit-packed)


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad command line reported in one line (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _flag(p, name: str, dest: str | None = None, **kw):
    """--name, Stim's spelling, and --name-with-dashes where it has underscores."""
    dashed = f"--{name.replace('_', '-')}"
    p.add_argument(f"--{name}", *([dashed] if "_" in name else []), dest=dest or name, **kw)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="stabilizer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, what in (("sample", "measurement results"), ("detect", "detection events")):
        s = sub.add_parser(name, help=f"sample {what} of a Stim circuit file")
        _flag(s, "shots", type=int, default=1, help="shots to take (default 1)")
        _flag(s, "seed", type=int, default=None, help="seed of the sampler (default: fresh entropy)")
        _flag(s, "in", dest="input", metavar="FILE", default=None, help="Stim circuit file (default: stdin)")
        _flag(s, "out", metavar="FILE", default=None, help="result file (default: stdout)")
        _flag(s, "out_format", choices=FORMATS, default="01", help="Stim result format (default 01)")
        if name == "sample":
            _flag(s, "skip_reference_sample", action="store_true",
                  help="results relative to the all-zero reference, not the noiseless circuit's")
        else:
            _flag(s, "append_observables", action="store_true", help="observable flips after the detectors")
            _flag(s, "obs_out", metavar="FILE", default=None, help="observable flips to this file")
            _flag(s, "obs_out_format", choices=FORMATS, default="01", help="format of --obs_out (default 01)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args)
    except (ValueError, OSError) as exc:  # CircuitError is a ValueError naming the line
        print(f"stabilizer {args.command}: error: {exc}", file=sys.stderr)
        return 1


def _run(args) -> int:
    if args.shots < 0:
        raise ValueError(f"--shots must be >= 0, got {args.shots}")
    formats = [args.out_format] + ([args.obs_out_format] if getattr(args, "obs_out", None) else [])
    if "ptb64" in formats and args.shots % 64:
        raise ValueError(f"ptb64 writes groups of 64 shots; --shots {args.shots} is not a multiple of 64")
    if args.input is None:
        text = sys.stdin.read()
    else:
        with open(args.input, encoding="utf-8") as f:
            text = f.read()
    circuit = Circuit(text)
    m, d, obs = circuit.num_measurements, circuit.num_detectors, circuit.num_observables
    if args.command == "sample":
        sampler = compile_sampler(circuit, seed=args.seed, skip_reference_sample=args.skip_reference_sample)
        outputs = [(sampler.sample(args.shots, bit_packed=True), m, (m, 0, 0), args.out, args.out_format)]
    else:
        sampler = compile_detector_sampler(circuit, seed=args.seed)
        if args.obs_out:
            dets, flips = sampler.sample(args.shots, separate_observables=True, bit_packed=True)
            outputs = [(dets, d, (0, d, 0), args.out, args.out_format),
                       (flips, obs, (0, 0, obs), args.obs_out, args.obs_out_format)]
        else:
            width = d + (obs if args.append_observables else 0)
            data = sampler.sample(args.shots, append_observables=args.append_observables, bit_packed=True)
            outputs = [(data, width, (0, d, width - d), args.out, args.out_format)]
    for packed, width, counts, path, fmt in outputs:
        packed = np.asarray(packed)
        sink = sys.stdout.buffer if path is None else open(path, "wb")
        try:
            for start in range(0, args.shots, BLOCK):
                bits = np.unpackbits(packed[start:start + BLOCK], axis=1, count=width, bitorder="little")
                sink.write(write_shot_data(bits.astype(bool), fmt, *counts))
        finally:
            if path is None:
                sink.flush()
            else:
                sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
