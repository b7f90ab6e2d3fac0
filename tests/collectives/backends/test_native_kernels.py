"""The native engine's reduction kernels give, bit for bit, what the Python engine
computes with NumPy (and ml_dtypes for bfloat16), for every dtype x op the argument
checker admits: NaN payloads, signed zeros, infinities, subnormals, overflow and
integer wrap-around included, in place or not, at any alignment.

They run twice where possible: ``_native/kernels.h`` compiled here with the C
compiler and called through ctypes (needs only a compiler), and the built extension
``_cnative.reduce(dst, a, b, dtype_code, op_code)`` (skipped until it is built).
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

from ndist.collectives import _check
from ndist.collectives._reduce_op import ReduceOp, _PremulSum
from ndist.collectives.backends.socket.wire import _frame
from ndist.collectives.backends.socket.schedules import _reduce

from tests.collectives.backends import _kernels_ctypes

ml_dtypes = pytest.importorskip("ml_dtypes")

SIZES = (0, 1, 7, 1000)
ALIASING = ("none", "dst_is_a", "dst_is_b", "all_same")
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
FLOAT8 = ("float8_e4m3fn", "float8_e5m2")


def _dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if name in ("bfloat16",) + FLOAT8 else np.dtype(name)


def _admitted(dtype: np.dtype, op: ReduceOp) -> bool:
    arg = _PremulSum(2.0) if op is ReduceOp.PREMUL_SUM else op
    try:
        _check.reduce_op(arg, dtype)
    except ValueError:
        return False
    return True


#: every (dtype name, ReduceOp) pair that reaches a backend
PAIRS = [(name, op) for name in _frame._DTYPES[1:] for op in ReduceOp if _admitted(_dtype(name), op)]


def native(name: str, op: ReduceOp) -> bool:
    """Whether the kernels compute (name, op) themselves (else they return -1)."""
    if name in FLOAT8:
        return False
    floating = name.startswith(("float", "complex", "bfloat"))
    if floating and not X86:
        return False
    return not (name.startswith("complex") and op is ReduceOp.PRODUCT)


def _codes(name: str, op: ReduceOp) -> tuple[int, int]:
    return _frame._DTYPES.index(name), _frame.REDOPS.index(op.name)


# ---- implementations under test ----

# the module's tests run on one xdist worker (tests/launch_scheduling.py): the ctypes build of
# the kernels (nd_reduce's "ctypes") is made once, not once per worker
XDIST_ONE_WORKER = True


@pytest.fixture(scope="module", params=["ctypes", "cnative"])
def nd_reduce(request):
    if request.param == "ctypes":
        if _kernels_ctypes.compiler() is None:
            pytest.skip("no C compiler (cc, gcc or $CC)")
        k = _kernels_ctypes.Kernels()
        yield k.nd_reduce
        k.close()
    else:
        mod = pytest.importorskip("ndist.collectives.backends.socket.native._cnative")
        yield mod.reduce


# ---- data: extremes mixed with ordinary values ----

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
#: (exponent bits, mantissa bits) of each binary floating format
_FORMAT = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52),
           "complex64": (8, 23), "complex128": (11, 52), "float8_e4m3fn": (4, 3), "float8_e5m2": (5, 2)}


def _float_specials(name: str) -> list[int]:
    """Bit patterns: zeros, subnormals, limits, infinities, NaNs with payloads."""
    e, m = _FORMAT[name]
    exp_all = ((1 << e) - 1) << m
    quiet = 1 << (m - 1)
    one = ((1 << (e - 1)) - 1) << m
    mags = [0, 1, (1 << m) - 1, 1 << m, exp_all - 1, exp_all, one, one | 1,
            exp_all | quiet, exp_all | quiet | 1, exp_all | quiet | 0x5, exp_all | 1, exp_all | 0x3,
            exp_all - (1 << m), (exp_all - (1 << m)) | ((1 << m) - 1)]
    sign = 1 << (e + m)
    return mags + [x | sign for x in mags]


def _data(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    dt = _dtype(name)
    if name == "bool":
        raw = rng.choice(np.array([0, 1, 1, 0, 2, 0x80, 0xFF], np.uint8), n)
        return raw.view(np.bool_)
    comp = 2 if dt.kind == "c" else 1
    width = dt.itemsize // comp
    u = _UINT[width]
    bits = rng.integers(0, np.iinfo(u).max, size=n * comp, dtype=u, endpoint=True)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        specials = np.array([0, 1, info.max, info.min, info.min + 1, info.max - 1], dt.type)
        pick = rng.random(n) < 0.4
        bits = bits.view(dt).copy()
        bits[pick] = rng.choice(specials, int(pick.sum()))
        return bits
    specials = np.array(_float_specials(name), u)
    ordinary = rng.standard_normal(n * comp) * rng.choice([1e-3, 1.0, 100.0, 6e4], n * comp)
    with np.errstate(over="ignore"):  # float16 overflows to inf: wanted
        ordinary = ordinary.astype(dt if dt.kind != "c" else np.dtype(f"f{width}")).view(u)
    r = rng.random(n * comp)
    out = np.where(r < 0.3, rng.choice(specials, n * comp), np.where(r < 0.5, bits, ordinary))
    return out.astype(u).view(dt)


def _expected(name: str, op: ReduceOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the Python engine computes: ``reduce_ordered`` into a fresh array."""
    out = np.empty_like(a)
    _reduce.reduce_ordered(out, [a, b], op)
    return out


def _parts(x: np.ndarray) -> np.ndarray:
    """The elements' bits as unsigned integers; complex as (real, imaginary) pairs."""
    width = x.itemsize // (2 if x.dtype.kind == "c" else 1)
    return x.view(_UINT[width])


def _either_nan(name: str, op: ReduceOp, a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """Where either operand's NaN may come out: float32 / float64 (complex: per part)
    add and multiply with a NaN on both sides. NumPy returns the first operand's
    payload from its vector loop and the second's from its scalar tail (for float32
    on AVX2: np.add of two 20-element NaN arrays gives a's payload in [0:16] and b's
    in [16:20]; a 1-element in-place np.add gives b's), so only 'one of the two,
    quieted' is NumPy's contract there."""
    if op not in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PREMUL_SUM, ReduceOp.PRODUCT):
        return None
    if not name.startswith(("float32", "float64", "complex")):
        return None
    fa, fb = _parts(a), _parts(b)
    ft = np.dtype(f"f{fa.itemsize}")
    return np.isnan(fa.view(ft)) & np.isnan(fb.view(ft))


def _assert_same_bits(got, want, a, b, what: str, either=None) -> None:
    g, w = _parts(got), _parts(want)
    bad = g != w
    if either is not None and either.any():
        pa, pb = _parts(a), _parts(b)
        quiet = pa.dtype.type(1 << (8 * pa.itemsize - 1 - (9 if pa.itemsize == 4 else 12)))
        ok = either & ((g == (pa[...] | quiet)) | (g == (pb[...] | quiet)))
        bad &= ~ok
        # the exemption must not hide a kernel that returns something else
        assert not (either & ~ok).any(), f"{what}: a NaN result that is neither operand's NaN"
    idx = np.nonzero(bad)[0]
    if len(idx):
        i = idx[0]
        hx = lambda arr: hex(int(_parts(arr)[i]))
        pytest.fail(f"{what}: {len(idx)} of {g.size} elements (parts) differ; first at [{i}]: "
                    f"a={hx(a)} b={hx(b)} expected {hx(want)} got {hx(got)}")


def _run(nd_reduce, name, op, a, b, aliasing):
    """(dst after the call, status) for one aliasing case, on copies of a and b."""
    dt, code = _codes(name, op)
    a, b = a.copy(), b.copy()
    if aliasing == "none":
        dst = np.full_like(a, 0)
        rc = nd_reduce(dst, a, b, dt, code)
    elif aliasing == "dst_is_a":
        dst = a
        rc = nd_reduce(a, a, b, dt, code)
    elif aliasing == "dst_is_b":
        dst = b
        rc = nd_reduce(b, a, b, dt, code)
    else:
        dst = a
        rc = nd_reduce(a, a, a, dt, code)
    return dst, rc


# ---- tests ----

@pytest.mark.parametrize("name,op", PAIRS, ids=[f"{n}-{o.name}" for n, o in PAIRS])
def test_kernel_matches_the_python_engine_bit_for_bit(nd_reduce, name, op):
    if not native(name, op):
        pytest.skip("computed by NumPy (the kernels return -1): see test_unsupported_pairs_return_minus_one")
    rng = np.random.default_rng([_frame._DTYPES.index(name), _frame.REDOPS.index(op.name)])
    for n in SIZES:
        a, b = _data(name, n, rng), _data(name, n, rng)
        for aliasing in ALIASING:
            bb = a if aliasing == "all_same" else b
            want = _expected(name, op, a, bb)
            got, rc = _run(nd_reduce, name, op, a, b, aliasing)
            assert rc == 0, f"{name} {op.name} n={n} {aliasing}: status {rc}"
            _assert_same_bits(got, want, a, bb, f"{name} {op.name} n={n} {aliasing}",
                              _either_nan(name, op, a, bb))


@pytest.mark.parametrize("name,op", PAIRS, ids=[f"{n}-{o.name}" for n, o in PAIRS])
def test_kernel_reads_and_writes_unaligned_buffers(nd_reduce, name, op):
    """Shared-memory segments hand out any offset: elements at odd addresses."""
    if not native(name, op):
        pytest.skip("computed by NumPy")
    rng = np.random.default_rng(7)
    n = 333
    dt = _dtype(name)
    a, b = _data(name, n, rng), _data(name, n, rng)
    want = _expected(name, op, a, b)
    backing = np.zeros(3 * (n * dt.itemsize + 8), np.uint8)

    def at(i, src):
        off = i * (n * dt.itemsize + 8) + 1 + i
        v = backing[off:off + n * dt.itemsize].view(dt)
        v[...] = src
        return v

    ua, ub, ud = at(0, a), at(1, b), at(2, np.zeros_like(a))
    assert ua.ctypes.data % 2 == 1
    assert nd_reduce(ud, ua, ub, *_codes(name, op)) == 0
    either = _either_nan(name, op, a, b)
    _assert_same_bits(ud, want, a, b, f"{name} {op.name} unaligned", either)
    assert nd_reduce(ua, ua, ub, *_codes(name, op)) == 0
    _assert_same_bits(ua, want, a, b, f"{name} {op.name} unaligned, in place", either)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX])
def test_16_bit_floats_every_bit_pattern(nd_reduce, name, op):
    """Every one of the 65,536 values as a, against shuffled and against fixed b's:
    rounding back to 16 bits (ties, overflow, subnormals) and every NaN."""
    if not X86:
        pytest.skip("floating-point kernels are checked on x86 only (they return -1 elsewhere)")
    dt = _dtype(name)
    a = np.arange(1 << 16, dtype=np.uint16).view(dt)
    rng = np.random.default_rng(16)
    for b in (rng.permutation(a.view(np.uint16)).view(dt), a[::-1].copy(),
              np.full_like(a, 1.0), np.full_like(a, -0.0), np.full_like(a, 3.0),
              np.full(a.size, 0x7E05 if name == "float16" else 0x7FC5, np.uint16).view(dt)):
        want = _expected(name, op, a, b)
        got = np.empty_like(a)
        assert nd_reduce(got, a, b, *_codes(name, op)) == 0
        _assert_same_bits(got, want, a, b, f"{name} {op.name}")
        got = np.empty_like(a)
        assert nd_reduce(got, b, a, *_codes(name, op)) == 0
        _assert_same_bits(got, _expected(name, op, b, a), b, a, f"{name} {op.name} (b, a)")


_UNSUPPORTED = [(n, o) for n, o in PAIRS if not native(n, o)]


@pytest.mark.parametrize("name,op", _UNSUPPORTED, ids=[f"{n}-{o.name}" for n, o in _UNSUPPORTED])
def test_unsupported_pairs_return_minus_one_and_leave_dst_alone(nd_reduce, name, op):
    rng = np.random.default_rng(3)
    a, b = _data(name, 7, rng), _data(name, 7, rng)
    dst = np.zeros_like(a)
    assert nd_reduce(dst, a, b, *_codes(name, op)) == -1
    assert not _parts(dst).any()


@pytest.mark.parametrize("dtype_code,op_code", [(0, 1), (len(_frame._DTYPES), 1), (6, 0),
                                                (6, len(_frame.REDOPS)), (-1, 1), (6, -1)])
def test_unknown_codes_return_minus_one(nd_reduce, dtype_code, op_code):
    dst = np.zeros(4, np.int32)
    a = np.arange(4, dtype=np.int32)
    assert nd_reduce(dst, a, a, dtype_code, op_code) == -1
    assert not dst.any()


def test_the_tables_this_test_follows_are_the_frame_codes():
    """The kernels hard-code the codes of _frame: a reordering must fail here."""
    assert _frame._DTYPES[1:] == ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32",
                                  "int64", "uint64", "float16", "float32", "float64", "complex64",
                                  "complex128", "bfloat16", "float8_e4m3fn", "float8_e5m2")
    assert _frame.REDOPS[1:] == ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR",
                                 "PREMUL_SUM")
