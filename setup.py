"""Build of ndist's compiled extensions: the native same-host engine
(``ndist/collectives/backends/socket/native/cnative.c`` -> ``_cnative``) and the
repeated call's bookkeeping (``ndist/collectives/_crun.c`` -> ``_crun``).

setuptools' own ``Extension``: no build dependency beyond setuptools and a C compiler,
nothing new at run time. Both are optional: where they cannot be built (no
compiler, no Python headers) ``pip install`` still succeeds and ndist runs its Python
engine, logging one warning at first use that says what to install
(``ndist/collectives/backends/socket/native/_engine.py``). ``NDIST_BUILD_NATIVE=0`` skips the
build; ``NDIST_NATIVE_CFLAGS`` adds flags (the sanitizer build in docs/native.md).
"""

import os
import shlex
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing when the extension cannot be compiled."""

    def run(self):
        try:
            super().run()
        except Exception as err:  # noqa: BLE001 - any compiler/platform failure
            self._skip(err)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as err:  # noqa: BLE001
            self._skip(f"{ext.name}: {err}")

    @staticmethod
    def _skip(err):
        sys.stderr.write(
            f"WARNING: ndist's native engine was not built ({err}); ndist will use its Python engine. "
            "Install a C compiler and the Python headers (e.g. apt install gcc python3-dev) and reinstall "
            "for the native engine.\n")


_NATIVE = "ndist/collectives/backends/socket/native"


def _extensions():
    if os.environ.get("NDIST_BUILD_NATIVE", "1").strip() == "0" or not sys.platform.startswith("linux"):
        return []
    flags = ["-std=gnu11", "-O3", "-ffp-contract=off", "-fno-strict-aliasing"]
    flags += shlex.split(os.environ.get("NDIST_NATIVE_CFLAGS", ""))
    link = shlex.split(os.environ.get("NDIST_NATIVE_LDFLAGS", ""))
    return [Extension("ndist.collectives.backends.socket.native._cnative",
                      sources=[f"{_NATIVE}/cnative.c", f"{_NATIVE}/ctcp.c", f"{_NATIVE}/common.c", f"{_NATIVE}/capi.c",
                               f"{_NATIVE}/clane.c", f"{_NATIVE}/ctwo.c", f"{_NATIVE}/crecord.c"],
                      depends=[f"{_NATIVE}/kernels.h", f"{_NATIVE}/cma.h", f"{_NATIVE}/common.h", f"{_NATIVE}/engines.h",
                               f"{_NATIVE}/ndist_engine.h", f"{_NATIVE}/crecord.h"],
                      extra_compile_args=flags, extra_link_args=link, optional=True),
            Extension("ndist.collectives._crun", sources=["ndist/collectives/_crun.c"],
                      extra_compile_args=flags, extra_link_args=link, optional=True)]


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
