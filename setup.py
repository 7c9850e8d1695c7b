"""Build of the optional C extensions exactdraft._cpu_kernels and exactdraft._sampler (everything
else is in pyproject).

The extensions are optional: if no C compiler is found or compilation fails, the build says why
and the package installs without them; exactdraft.kernels.cpu and exactdraft.sampling.native
then report them unavailable and the slower Python paths run.
Floating-point contraction is turned off so that every multiply and add is the one the source
names (the kernels' bitwise row invariance relies on that); SIMD levels are compiled per source
file with target attributes and picked at run time, so no -march flag is used.
"""

from __future__ import annotations

import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

SOURCES = [
    "csrc/cpu/module.c",
    "csrc/cpu/module_layer.c",
    "csrc/cpu/decoder_layer.c",
    "csrc/cpu/pack_dot.c",
    "csrc/cpu/dispatch.c",
    "csrc/cpu/thread_pool.c",
    "csrc/cpu/level_scalar.c",
    "csrc/cpu/level_scalar_fma.c",
    "csrc/cpu/level_avx2.c",
    "csrc/cpu/level_avx512.c",
    "csrc/cpu/level_avx512vnni.c",
    "csrc/cpu/level_amx.c",
    "csrc/cpu/level_amx_emulated.c",
    "csrc/cpu/amx_probe.c",
    "csrc/cpu/random_problems.c",
    "csrc/cpu/level_neon.c",
]
HEADERS = [
    "csrc/cpu/kernels.h",
    "csrc/cpu/formats.h",
    "csrc/cpu/x86_intrinsics.h",
    "csrc/cpu/kernel_body.h",
    "csrc/cpu/dot_body.h",
    "csrc/cpu/dot_record.h",
    "csrc/cpu/dot_tiles.h",
    "csrc/cpu/tiles.h",
    "csrc/cpu/tile_amx.h",
    "csrc/cpu/tile_emulated.h",
    "csrc/cpu/amx_probe.h",
    "csrc/cpu/random_problems.h",
    "csrc/cpu/attention_body.h",
    "csrc/cpu/decoder_layer.h",
    "csrc/cpu/pack_dot.h",
    "csrc/cpu/module_args.h",
    "csrc/cpu/module_layer.h",
    "csrc/cpu/dispatch.h",
    "csrc/cpu/thread_pool.h",
    "csrc/cpu/vec_scalar.h",
    "csrc/cpu/vec_avx2.h",
    "csrc/cpu/vec_avx512.h",
    "csrc/cpu/vec_neon.h",
    "csrc/cpu/dot_scalar.h",
    "csrc/cpu/dot_avx2.h",
    "csrc/cpu/dot_avx512vnni.h",
    "csrc/cpu/dot_neon.h",
    "csrc/cpu/lookup_values.h",
    "csrc/cpu/dot_lookup_scalar.h",
    "csrc/cpu/dot_lookup_avx2.h",
    "csrc/cpu/dot_lookup_avx512vnni.h",
    "csrc/cpu/dot_lookup_neon.h",
]
UNIX_FLAGS = ["-std=c11", "-O3", "-g0", "-ffp-contract=off", "-fno-math-errno",
              "-fvisibility=hidden", "-pthread", "-Wall", "-Wno-psabi"]
# The sampler must round every operation as its Python twin does: no contraction into fused
# multiply-adds and no -ffast-math (its sources refuse to compile under the latter); its exp and
# log are exactdraft's own (csrc/sampler/float64_math.h), not the C library's.
SAMPLER_SOURCES = ["csrc/sampler/sampler.c", "csrc/sampler/draw.c", "csrc/sampler/order.c",
                   "csrc/sampler/top_p.c"]
SAMPLER_HEADERS = ["csrc/sampler/draw.h", "csrc/sampler/draw_simd.h",
                   "csrc/sampler/float64_math.h"]
SAMPLER_UNIX_FLAGS = ["-std=c11", "-O3", "-g0", "-ffp-contract=off", "-fvisibility=hidden",
                      "-Wall"]


class OptionalBuildExt(build_ext):
    """Builds the extension with the flags above; a failure is reported, never fatal."""

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":
            for extension in self.extensions:
                if extension.name == "exactdraft._sampler":
                    extension.extra_compile_args = SAMPLER_UNIX_FLAGS
                    extension.libraries = ["m"]
                else:
                    extension.extra_compile_args = UNIX_FLAGS
                    extension.extra_link_args = ["-pthread"]
        super().build_extensions()

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # noqa: BLE001 - any build failure leaves the package usable
            self._skip(error)

    def build_extension(self, extension: Extension) -> None:
        try:
            super().build_extension(extension)
        except Exception as error:  # noqa: BLE001
            self._skip(error)

    def _skip(self, error: Exception) -> None:
        print(f"warning: building an optional C extension failed ({error}); exactdraft "
              "installs without it and falls back to its slower Python paths", file=sys.stderr)


# The Metal shader sources (and their C++ emulator) ship inside the package, where
# exactdraft.kernels.metal looks for them when csrc/ is not beside it.
SHADERS = "exactdraft.kernels.metal_shaders"
EMULATOR = SHADERS + ".emu"  # a data-only folder, listed so setuptools knows it ships
# The draft-head training prompts and the bundled draft heads: data-only folders too.
DATA = {"exactdraft.data": ["*.txt"], "exactdraft.data.heads": [],
        "exactdraft.data.heads.smollm2": ["*.json", "*.safetensors", "*.md"],
        "exactdraft.data.heads.gemma3_270m": ["*.json", "*.safetensors", "*.md"]}

setup(
    packages=find_packages(include=["exactdraft", "exactdraft.*"]) + [SHADERS, EMULATOR,
                                                                      *DATA],
    package_dir={SHADERS: "csrc/metal", EMULATOR: "csrc/metal/emu"},
    package_data={SHADERS: ["*.metal", "SUBSET.md"], EMULATOR: ["*.h", "*.cpp"], **DATA},
    ext_modules=[Extension("exactdraft._cpu_kernels", sources=SOURCES, depends=HEADERS),
                 Extension("exactdraft._sampler", sources=SAMPLER_SOURCES,
                           depends=SAMPLER_HEADERS)],
    cmdclass={"build_ext": OptionalBuildExt},
)
