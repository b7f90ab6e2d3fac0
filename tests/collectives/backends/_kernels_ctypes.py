"""Test helper: the native engine's reduction kernels (``native/kernels.h``) built
with the C compiler into a temporary folder and called through ctypes.

The kernels are checked on their own, without the extension that will embed them,
so the test runs wherever a C compiler is, with or without the built extension.
The flags are the extension's: optimized (vectorized loops), no FMA contraction.
``$NDIST_TEST_KERNEL_CFLAGS`` adds flags (to check the kernels under sanitizers,
another -O level or -march=native by hand).
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import shlex
import shutil
import subprocess
import tempfile

import ndist.collectives.backends.socket as _socket_pkg

HEADER_DIR = pathlib.Path(_socket_pkg.__file__).parent / "native"
CFLAGS = ("-std=c11", "-O3", "-ffp-contract=off", "-fPIC", "-shared", "-Wall", "-Wextra")

_SHIM = """
#include "kernels.h"
int nd_reduce_c(void *dst, const void *a, const void *b, size_t count, int dtype, int op)
{
    return nd_reduce(dst, a, b, count, dtype, op);
}
"""


def compiler() -> str | None:
    """The C compiler to build with: ``$CC``, else cc or gcc on PATH; None if none."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def build(tmpdir: pathlib.Path, extra: tuple = ()) -> ctypes.CDLL:
    """Compile the kernels into ``tmpdir`` and load them; CalledProcessError with the
    compiler's output when the build fails."""
    src = tmpdir / "nd_kernels_shim.c"
    lib = tmpdir / "nd_kernels_shim.so"
    src.write_text(_SHIM)
    extra = (*shlex.split(os.environ.get("NDIST_TEST_KERNEL_CFLAGS", "")), *extra)
    proc = subprocess.run([compiler(), *CFLAGS, *extra, f"-I{HEADER_DIR}", str(src), "-o", str(lib)],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    dll = ctypes.CDLL(str(lib))
    fn = dll.nd_reduce_c
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                   ctypes.c_int, ctypes.c_int]
    dll.warnings = proc.stderr
    return dll


class Kernels:
    """``nd_reduce(dst, a, b, dtype_code, op_code)``: the C function on NumPy arrays
    (C-contiguous, same dtype and size); returns its status (0, or -1 unsupported)."""

    def __init__(self, extra: tuple = ()):
        self._tmp = tempfile.TemporaryDirectory(prefix="nd_kernels_")
        self.lib = build(pathlib.Path(self._tmp.name), extra)

    def nd_reduce(self, dst, a, b, dtype_code: int, op_code: int) -> int:
        for arr in (dst, a, b):
            assert arr.flags.c_contiguous and arr.dtype == dst.dtype and arr.size == dst.size
        assert dst.flags.writeable
        return self.lib.nd_reduce_c(dst.ctypes.data, a.ctypes.data, b.ctypes.data, dst.size,
                                    dtype_code, op_code)

    def close(self) -> None:
        self._tmp.cleanup()
