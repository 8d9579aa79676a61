"""stabilizer: a bit-packed stabilizer simulator and many-shot sampler on JAX, with Stim's names.

    import stabilizer as st
    circ = st.Circuit(stim_text)                      # or st.Circuit(stim.Circuit(...))
    st.compile_sampler(circ, seed=0).sample(shots)    # (shots, num_measurements) bool
    st.compile_detector_sampler(circ, seed=0).sample(shots, separate_observables=True)
    st.compile_detector_sampler(circ).sample(shots, bit_packed=True, on_device=True)  # jax.Arrays
    sim = st.TableauSimulator(seed=0); sim.do(circ); sim.measure(0); sim.current_measurement_record()

  circuits/  the front end: Stim text (circuit), the lowering to op tables (program)
  tableau/   the packed inverse tableau and its pure rules (tableau), their Pallas kernels (kernels),
             TableauSimulator (simulator)
  frames/    Pauli frames of many shots (frames), their Pallas kernel (frame_kernel), the compiled
             samplers (sampler)
  cli.py     the `stabilizer` command, writing Stim's result formats (formats.py)
  sinter_sampler.py  `SinterSampler`, a `sinter.Sampler` (optional: needs sinter, the `sampler` extra):
             sinter.collect(tasks=..., decoders=["ours"], custom_decoders={"ours": st.SinterSampler()})

Each folder imports only those below it (circuits < tableau < frames < cli); ARCHITECTURE.md draws
the data path.

Compiled programs persist: importing `stabilizer` imports the shared gate table from `pauliprop`,
whose import turns JAX's persistent compilation cache on (pauliprop/runtime/compilation.py), so a
second process (a sinter worker, the next script) loads the samplers' programs from disk. It lives in
`$PAULIPROP_CACHE_DIR`, else `$XDG_CACHE_HOME/pauliprop/jax` (default `~/.cache/pauliprop/jax`);
`PAULIPROP_NO_CACHE=1` turns it off, and a cache already configured for JAX
(`jax_compilation_cache_dir`, `$JAX_COMPILATION_CACHE_DIR`) is left as it is. The frames' programs
are keyed by bucketed sizes with probabilities, targets, detectors and repeat counts as data, so the
tasks of a threshold sweep share them. On CPUs the samplers compile nothing: where the package was
installed with a C compiler they run as C loops (stabilizer/frames/native.py; STABILIZER_NATIVE=0 runs
the JAX programs instead, STABILIZER_NATIVE=host runs the C loops on the host's cores beside a GPU too,
STABILIZER_NATIVE_THREADS sets their threads).
"""

from .circuits.circuit import (
                      Circuit,
                      CircuitError,
                      CircuitInstruction,
                      CircuitRepeatBlock,
                      GateTarget,
)
from .frames.sampler import (
                      CompiledDetectorSampler,
                      CompiledMeasurementSampler,
                      compile_detector_sampler,
                      compile_sampler,
                      reference_sample,
)
from .tableau.simulator import TableauSimulator


def __getattr__(name: str):
    if name == "SinterSampler":  # sinter is optional: imported when the sampler is first asked for
        from .sinter_sampler import SinterSampler

        return SinterSampler
    raise AttributeError(f"module 'stabilizer' has no attribute {name!r}")


__all__ = [
                      "Circuit",
                      "CircuitError",
                      "CircuitInstruction",
                      "CircuitRepeatBlock",
                      "CompiledDetectorSampler",
                      "CompiledMeasurementSampler",
                      "GateTarget",
                      "SinterSampler",
                      "TableauSimulator",
                      "compile_detector_sampler",
                      "compile_sampler",
                      "reference_sample",
]
