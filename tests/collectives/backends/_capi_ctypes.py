"""Test helper: the engine's C interface (``ndist_engine.h``) from Python through ctypes, and
the C test program (``capi_test.c``) built with the system C compiler.

``table()`` reads the function table from the capsule ``_cnative._C_API`` (its pointer, as a C
caller's ``PyCapsule_Import`` would) and calls its functions through ctypes: ``CFUNCTYPE``
releases the GIL around each call, as a caller without it (``gil=True``: ``PYFUNCTYPE``, which
keeps it)."""

from __future__ import annotations

import ctypes
import os
import pathlib
import shutil
import subprocess
import sysconfig

import numpy as np

HERE = pathlib.Path(__file__).parent
SOURCE = HERE / "capi_test.c"
G = ctypes.c_uint64
# ndist_engine.h's codes
DTYPES = {np.dtype(n): i for i, n in enumerate(("", "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                                                "int64", "uint64", "float16", "float32", "float64", "complex64",
                                                "complex128")) if n}
OPS = {"SUM": 1, "PRODUCT": 2, "MIN": 3, "MAX": 4, "AVG": 5, "BAND": 6, "BOR": 7, "BXOR": 8}


class Error(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("rank", ctypes.c_int), ("usable", ctypes.c_int),
                ("type", ctypes.c_char * 48), ("message", ctypes.c_char * 1024)]

    def as_tuple(self):
        return self.status, self.rank, self.usable, self.type.decode(), self.message.decode()


def _api_type(gil: bool):
    F = ctypes.PYFUNCTYPE if gil else ctypes.CFUNCTYPE
    E, p, n, i = ctypes.POINTER(Error), ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    ip = ctypes.POINTER(ctypes.c_int)

    class Api(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("size", ctypes.c_uint32),
                    ("group_info", F(i, G, ip, ip, E)),
                    ("all_reduce", F(i, G, p, n, i, i, E)),
                    ("broadcast", F(i, G, p, n, i, i, E)),
                    ("all_gather", F(i, G, p, p, n, i, E)),
                    ("reduce_scatter", F(i, G, p, p, n, i, i, E)),
                    ("all_to_all", F(i, G, p, p, n, i, E)),
                    ("barrier", F(i, G, E)),
                    ("all_to_all_v", F(i, G, p, n, p, p, n, p, i, E))]

    return Api


def table_pointer() -> int:
    from ndist.collectives.backends.socket.native import _cnative

    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(_cnative._C_API, b"ndist.collectives.backends.socket.native._cnative._C_API")


def table(gil: bool = False):
    return _api_type(gil).from_address(table_pointer())


class Engine:
    """The table's calls on NumPy arrays: each returns the error tuple, or None on success."""

    def __init__(self, handle: int, gil: bool = False) -> None:
        self.api, self.h = table(gil), handle

    def _run(self, fn, *args):
        err = Error()
        status = fn(self.h, *args, ctypes.byref(err))
        if status:
            assert status == err.status, (status, err.as_tuple())
            return err.as_tuple()
        return None

    def all_reduce(self, buf, op="SUM", dtype=None):
        return self._run(self.api.all_reduce, buf.ctypes.data, buf.size, dtype or DTYPES[buf.dtype], OPS[op])

    def broadcast(self, buf, root):
        return self._run(self.api.broadcast, buf.ctypes.data, buf.size, DTYPES[buf.dtype], root)

    def all_gather(self, out, inp):
        return self._run(self.api.all_gather, out.ctypes.data, inp.ctypes.data, inp.size, DTYPES[inp.dtype])

    def reduce_scatter(self, out, inp, op="SUM"):
        return self._run(self.api.reduce_scatter, out.ctypes.data, inp.ctypes.data, out.size, DTYPES[out.dtype],
                         OPS[op])

    def all_to_all(self, out, inp, count=None):
        return self._run(self.api.all_to_all, out.ctypes.data, inp.ctypes.data, inp.size if count is None else count,
                         DTYPES[inp.dtype])

    def barrier(self):
        return self._run(self.api.barrier)

    def all_to_all_v(self, out, out_counts, inp, in_counts, dtype=None):
        """``out_counts`` / ``in_counts``: lists of element counts (or None: a NULL pointer)"""
        oc = None if out_counts is None else np.ascontiguousarray(out_counts, np.int64)
        ic = None if in_counts is None else np.ascontiguousarray(in_counts, np.int64)
        return self._run(self.api.all_to_all_v, out.ctypes.data if out is not None else None,
                         0 if out is None else out.size, None if oc is None else oc.ctypes.data,
                         inp.ctypes.data if inp is not None else None, 0 if inp is None else inp.size,
                         None if ic is None else ic.ctypes.data, dtype or DTYPES[(inp if inp is not None else out).dtype])


def compiler() -> str | None:
    """``$CC``, else cc or gcc on PATH; None if none."""
    for name in (os.environ.get("CC"), "cc", "gcc"):
        if name and shutil.which(name):
            return name
    return None


def include_dir() -> str:
    import ndist.collectives

    return ndist.collectives.engine_include_dir()


def build_library(folder: pathlib.Path) -> pathlib.Path:
    """``capi_test.c`` as a shared library (``capi_selftest_thread``) in ``folder``.
    ``$NDIST_TEST_CAPI_CFLAGS`` adds flags (a sanitizer build)."""
    out = folder / "libcapi_test.so"
    flags = os.environ.get("NDIST_TEST_CAPI_CFLAGS", "").split()
    subprocess.run([compiler(), "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", "-pthread",
                    f"-I{include_dir()}", *flags, str(SOURCE), "-o", str(out)], check=True, capture_output=True,
                   text=True)
    return out


def build_program(folder: pathlib.Path) -> pathlib.Path:
    """``capi_test.c`` as a program that embeds CPython (``-DCAPI_TEST_MAIN``)."""
    out = folder / "capi_test"
    cfg = sysconfig.get_config_var
    libdir, ver = cfg("LIBDIR"), cfg("LDVERSION")
    subprocess.run([compiler(), "-std=c11", "-O2", "-Wall", "-Wextra", "-pthread", "-DCAPI_TEST_MAIN",
                    f"-I{include_dir()}", f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o", str(out),
                    f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-lpython{ver}", "-lm", "-ldl"],
                   check=True, capture_output=True, text=True)
    return out


def selftest(library: str, handle: int) -> tuple[int, str]:
    """Run ``capi_selftest_thread`` of the built library on the group of ``handle``."""
    lib = ctypes.CDLL(library)
    fn = lib.capi_selftest_thread
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, G, ctypes.c_char_p, ctypes.c_size_t]
    why = ctypes.create_string_buffer(1400)
    rc = fn(table_pointer(), handle, why, len(why))
    return rc, why.value.decode()


class Calls:
    """``capi_test.c``'s ``capi_calls_*`` in the built ``library``: ``calls`` float64 SUM
    all_reduces of ``count`` ones on the group of ``handle``, from a thread of the library's
    own, started now; the first at once, the others after ``go()``. ``done()`` counts those that
    succeeded; both keep the GIL held (``PyDLL``). ``join()`` waits for the thread: (0, "") or
    (1, why)."""

    def __init__(self, library: str, handle: int, calls: int, count: int) -> None:
        lib = ctypes.CDLL(library)
        start, self._join = lib.capi_calls_start, lib.capi_calls_join
        start.restype, start.argtypes = ctypes.c_void_p, [ctypes.c_void_p, G, ctypes.c_int, ctypes.c_size_t]
        self._join.restype = ctypes.c_int
        self._join.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        held = ctypes.PyDLL(library)
        self._done, self._go = held.capi_calls_done, held.capi_calls_go
        self._done.restype, self._done.argtypes = ctypes.c_int, [ctypes.c_void_p]
        self._go.restype, self._go.argtypes = None, [ctypes.c_void_p]
        self.c = start(table_pointer(), handle, calls, count)
        assert self.c, "capi_calls_start failed"

    def done(self) -> int:
        return self._done(self.c)

    def go(self) -> None:
        self._go(self.c)

    def join(self) -> tuple[int, str]:
        why = ctypes.create_string_buffer(1400)
        rc = self._join(self.c, why, len(why))
        return rc, why.value.decode()
