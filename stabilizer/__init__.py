"""stabilizer: a bit-packed stabilizer tableau simulator and many-shot sampler on JAX (Stim-compatible).

Not built yet: issue 4 builds Circuit, TableauSimulator, compile_sampler and compile_detector_sampler.
"""
