"""The native CPU engine's C loops (pauliprop/propagation/_native.c) and the stabilizer samplers' (stabilizer/frames/
_frames.c), compiled at install; the rest of the project's configuration is in pyproject.toml. Where no C compiler
is found the build goes on without them (optional) and CPUs run concrete calls on XLA's engines
(pauliprop.propagation.propagate.native_engine, stabilizer.frames.sampler.native_engine); where the compiler has
no OpenMP, the libraries are built without it and run each rotation, or each chunk of shots, on one thread."""

import platform
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

if sys.platform == "win32":
    FLAGS, OPENMP = ["/O2", "/fp:precise"], (["/openmp"], [])
else:  # every value as numpy rounds it (no fused multiply-adds); popcnt on x86-64 (every x86-64 CPU since 2008)
    FLAGS, OPENMP = ["-O3", "-std=c99", "-ffp-contract=off", "-fno-strict-aliasing"], (["-fopenmp"], ["-fopenmp"])
    if platform.machine().lower() in ("x86_64", "amd64"):
        FLAGS.append("-mpopcnt")


class BuildWithOpenMP(build_ext):
    """The extension with OpenMP where the compiler has it, else without."""

    def build_extension(self, ext):
        compile_flags, link_flags = list(ext.extra_compile_args), list(ext.extra_link_args)
        ext.extra_compile_args, ext.extra_link_args = compile_flags + OPENMP[0], link_flags + OPENMP[1]
        try:
            super().build_extension(ext)
        except Exception as error:  # noqa: BLE001 (any compiler or linker failure: try again without OpenMP)
            print(f"pauliprop: building {ext.name} with OpenMP failed ({error}); building it without", file=sys.stderr)
            ext.extra_compile_args, ext.extra_link_args = compile_flags, link_flags
            super().build_extension(ext)


setup(ext_modules=[Extension("pauliprop.propagation._native", ["pauliprop/propagation/_native.c"],
                             depends=["pauliprop/propagation/_native_kernels.h"], extra_compile_args=FLAGS,
                             optional=True),
                   # the stabilizer samplers' CPU engine (stabilizer/frames/native.py): without it CPUs run the
                   # samplers' JAX programs
                   Extension("stabilizer.frames._frames", ["stabilizer/frames/_frames.c"], extra_compile_args=FLAGS,
                             optional=True)],
      cmdclass={"build_ext": BuildWithOpenMP})
