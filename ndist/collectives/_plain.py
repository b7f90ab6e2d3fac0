"""The repeated call's Python lane: a group's blocking collectives on plain NumPy buffers,
checked on this call's arguments only and run through ``run_fields``.

Each public function of ``_api.py`` has one body with one fast exit: with ``async_op=False``
on a group that has a fast lane (``ProcessGroup.fast``, set once a checked CPU collective
made the group's lane) it asks it first, ``pg.fast.all_reduce(tensor, op)`` and so on, and
takes its general path only when the answer is False. The fast lane is this ``PlainLane``,
or, once the group runs the socket backend's native engine (one level or two), the backend's
``_cnative.FastLane`` (``SocketBackend.fast_lane``), which runs the common case in one C
call and hands every other case to this lane, unchanged (docs/architecture.md, "One call,
by hand").

What a method takes (anything else, bad input included, answers False: the general path
checks everything in its own order and raises its own errors; ``tests/collectives/
test_repeated.py``): a writable, C-contiguous NumPy array (or ``ndist.Tensor`` over one, or a
buffer-protocol object that FastLane reads in C, viewed as ``_convert`` views it: ``_buffer``;
writable even on ``broadcast``'s root, narrower than the general path), or for two buffers
both such arrays of one of ``_check.PLAIN_DTYPES``, the same dtype, the output writable and
C-contiguous, the input C-contiguous, not overlapping (two arrays that each own their memory
overlap only if they are one array; views go through ``np.may_share_memory`` as in
``unaliased``). Each op then checks what is its own: the reduce op (``PLAIN_OPS`` /
``PLAIN_SUM``, PREMUL_SUM excluded), ``broadcast``'s ``src`` (a global rank of the group, no
``group_src``), ``barrier``'s ``device_ids`` (None), sizes and shapes. Nothing about the
buffers is remembered between calls: flags, shape and dtype can change in place and a freed
array's ``id`` is reused.
"""

from __future__ import annotations

import sys

import numpy as np

from ._backend import Call, Op
from ._check import PLAIN_DTYPES, PLAIN_OPS, PLAIN_SUM
from ._common import _failed, run_fields
from ._convert import BUFFER_FORMATS
from ._reduce_op import ReduceOp

__all__ = ["PlainLane"]

_ndarray = np.ndarray
_may_share = np.may_share_memory
_SUM = ReduceOp.SUM
_ALL_REDUCE, _BROADCAST, _ALL_GATHER_INTO, _REDUCE_SCATTER_FROM, _ALL_TO_ALL_SINGLE, _BARRIER = (
    Op.ALL_REDUCE, Op.BROADCAST, Op.ALL_GATHER_INTO, Op.REDUCE_SCATTER_FROM, Op.ALL_TO_ALL_SINGLE, Op.BARRIER)
# run_fields takes a Call's fields in order; the order is checked here, once
if Call._fields != ("op", "device", "dtype", "out", "inp", "outputs", "inputs", "out_splits", "in_splits", "root",
                    "redop", "scale", "tag"):  # pragma: no cover - a guard for whoever edits Call
    raise ImportError(f"ndist.collectives._plain builds Call positionally; its fields changed: {Call._fields}")


def _unwrap(obj):
    """An ndist.Tensor's array, else ``obj``. Looked up in ``sys.modules``: a Tensor
    exists only once ndist.tensor is loaded, and ndist.distributed must not load it."""
    mod = sys.modules.get("ndist.tensor")
    return obj._data if mod is not None and type(obj) is mod.Tensor else obj


# ------------------------------------------------------------ buffer-protocol objects
#: a buffer's struct format -> its dtype, as FastLane reads it (native/clane.c, ``buf_arg``): a
#: format of ``_convert.BUFFER_FORMATS`` with no prefix, '@', '=' or the machine's own order
_FORMATS = {prefix + code: dt for code, dt in BUFFER_FORMATS.items()
            for prefix in ("", "@", "=", "<" if sys.byteorder == "little" else ">")}
_BUILTINS = (_ndarray, list, tuple, dict, str, bytes, int, float, complex)
_GENERIC = type(object.__getattribute__)  # (a type's own __getattribute__ in Python is a function)
#: type -> whether ``_buffer`` reads its instances (``_buffer_type``), decided once per type
_BUFFER_TYPES: dict = {}


def _buffer_type(tp) -> bool:
    """Whether ``_convert.as_array`` reads an instance of ``tp`` through the buffer protocol and
    ``tp`` answers for its instances, as FastLane's ``classify`` / ``buffer_kind`` decide
    (native/clane.c): not a NumPy array, a builtin scalar, container or ``bytes``, a torch or
    CuPy type; none of ``__dlpack__`` with ``__dlpack_device__`` (an ndist.Tensor), the array
    interfaces; no instance dict, no ``__getattr__`` or Python ``__getattribute__`` (so an
    instance has no attribute its type lacks). Whether it exports a buffer at all: ``_buffer``
    asks the instance."""
    if issubclass(tp, _BUILTINS):
        return False
    mod = getattr(tp, "__module__", None)
    if not isinstance(mod, str) or mod.startswith(("torch", "cupy")):
        return False
    if tp.__dictoffset__ != 0 or hasattr(tp, "__getattr__") or type(tp.__getattribute__) is not _GENERIC:
        return False
    if hasattr(tp, "__dlpack__") and hasattr(tp, "__dlpack_device__"):
        return False
    return not (hasattr(tp, "__array_interface__") or hasattr(tp, "__array_struct__")
                or hasattr(tp, "__cuda_array_interface__"))


def _buffer(obj):
    """A NumPy array over ``obj``'s memory when it is a buffer-protocol object FastLane would read
    (``_buffer_type``; the format's dtype at the buffer's item size; C-contiguous), of the buffer's
    shape, as ``_convert._from_buffer`` views it; else None (the general path decides)."""
    tp = type(obj)
    ok = _BUFFER_TYPES.get(tp)
    if ok is None:
        if len(_BUFFER_TYPES) >= 64:  # (types made at run time: bounded)
            _BUFFER_TYPES.clear()
        ok = _BUFFER_TYPES[tp] = _buffer_type(tp)
    if not ok:
        return None
    try:
        view = memoryview(obj)
    except (TypeError, ValueError, BufferError):  # no buffer, a released view, a refusal: the general path's
        return None
    dt = _FORMATS.get(view.format)
    if dt is None or dt.itemsize != view.itemsize or not view.c_contiguous:
        return None
    arr = np.frombuffer(view, dt)
    return arr if view.ndim == 1 else arr.reshape(view.shape)


def _array(obj):
    """``obj``'s NumPy array when it is a Tensor over one or a buffer ``_buffer`` reads; else None."""
    arr = _unwrap(obj)
    return arr if type(arr) is _ndarray else _buffer(arr)


def _one(tensor):
    """``tensor``'s array when it is a writable, C-contiguous (aligned) NumPy array, a
    Tensor over one or a buffer viewed as one (``_buffer``); else None."""
    arr = tensor if type(tensor) is _ndarray else _array(tensor)
    return arr if arr is not None and arr.flags.carray else None


def _two(output, input):
    """``(out, inp, dtype)`` when neither needs staging or a copy (see the module); else None."""
    o = output if type(output) is _ndarray else _array(output)
    i = input if type(input) is _ndarray else _array(input)
    if type(o) is _ndarray and type(i) is _ndarray:
        of, inf, dt = o.flags, i.flags, i.dtype
        if (of.carray and inf.c_contiguous and (o.dtype is dt or o.dtype == dt) and dt in PLAIN_DTYPES
                and (of.owndata and inf.owndata and o is not i or not _may_share(o, i))):
            return o, i, dt
    return None


def _splits(sizes, rows: int, n: int):
    """``sizes`` as a new list when it is a list or tuple of ``n`` Python ints, none
    negative, that sum to ``rows``; else None. A new list: the record never holds the
    caller's object."""
    if (type(sizes) is list or type(sizes) is tuple) and len(sizes) == n:
        out = list(sizes)
        total = 0
        for s in out:
            if type(s) is not int or s < 0:
                return None
            total += s
        if total == rows:
            return out
    return None


def _rows_to_elements(splits: list[int], shape) -> list[int]:
    row = 1
    for d in shape[1:]:
        row *= d
    return splits if row == 1 else [s * row for s in splits]


def _op(op, dtype):
    """``_check.reduce_op(op, dtype)`` for a ReduceOp other than PREMUL_SUM on a plain
    dtype it applies to, from the table; None for anything else."""
    if op is _SUM:
        return PLAIN_SUM.get(dtype)
    return PLAIN_OPS.get((op._value_, dtype)) if type(op) is ReduceOp else None


class PlainLane:
    """One group's repeated call in Python (the CPU ``Lane`` of ``_common.py``). Each method
    takes the public function's arguments and returns True when it ran the call, False when
    the general path must. After each call it ran it asks the backend, until the answer is
    final, for the compiled lane that replaces it (``fast_lane``)."""

    __slots__ = ("lane", "pending")

    def __init__(self, lane) -> None:
        self.lane = lane
        #: the backend may offer a compiled lane (``fast_lane``) once its engine is chosen
        self.pending = hasattr(lane.backend, "fast_lane")

    def upgrade(self) -> None:
        """Ask for the compiled lane now: the public layer's general path asks after a call it
        ran, so a program none of whose calls this lane takes (torch tensors, other DLPack
        arrays, which the compiled lane reads itself) gets the compiled lane too."""
        if self.pending:
            self._upgrade()

    def _upgrade(self) -> None:
        lane = self.lane
        fast = lane.backend.fast_lane(self, _failed)
        if fast is None:  # the engine is not chosen yet (an async first call): ask again later
            return
        self.pending = False
        pg = lane.pg
        if fast is not False and pg.lanes.get("cpu") is lane and pg.fast is self:
            pg.fast = fast

    def all_reduce(self, tensor, op) -> bool:
        buf = _one(tensor)
        if buf is None:
            return False
        dt = buf.dtype
        checked = PLAIN_SUM.get(dt) if op is _SUM else _op(op, dt)  # (the default, without a call)
        if checked is None:
            return False
        lane, n = self.lane, buf.size
        run_fields(lane.book, lane.all_reduce, n, n,
                   _ALL_REDUCE, "cpu", dt, buf, None, None, None, None, None, None, checked[0], checked[1], 0)
        if self.pending:
            self._upgrade()
        return True

    def reduce_scatter_from(self, output, input, op) -> bool:
        two = _two(output, input)
        if two is None:
            return False
        o, i, dt = two
        lane = self.lane
        checked = PLAIN_SUM.get(dt) if op is _SUM else _op(op, dt)
        n_out, n_in = o.size, i.size
        if checked is None or n_in != n_out * lane.size:
            return False
        run_fields(lane.book, lane.reduce_scatter_from, n_in, n_out,
                   _REDUCE_SCATTER_FROM, "cpu", dt, o if o.ndim == 1 else o.reshape(-1),
                   i if i.ndim == 1 else i.reshape(-1), None, None, None, None, None,
                   checked[0], checked[1], 0)
        if self.pending:
            self._upgrade()
        return True

    def broadcast(self, tensor, src, group_src) -> bool:
        if type(src) is not int or group_src is not None:
            return False
        buf = _one(tensor)  # writable even on the root: narrower than needed
        if buf is None:
            return False
        lane = self.lane
        root, dt = lane.group_rank.get(src), buf.dtype
        if root is None or dt not in PLAIN_DTYPES:
            return False
        n = buf.size
        run_fields(lane.book, lane.broadcast, n, n,
                   _BROADCAST, "cpu", dt, buf, None, None, None, None, None, root, None, None, 0)
        if self.pending:
            self._upgrade()
        return True

    def all_gather_into(self, output, input) -> bool:
        two = _two(output, input)
        if two is None:
            return False
        o, i, dt = two
        lane = self.lane
        n_out, n_in = o.size, i.size
        if n_out != n_in * lane.size:
            return False
        run_fields(lane.book, lane.all_gather_into, n_in, n_out,
                   _ALL_GATHER_INTO, "cpu", dt, o if o.ndim == 1 else o.reshape(-1),
                   i if i.ndim == 1 else i.reshape(-1), None, None, None, None, None, None, None, 0)
        if self.pending:
            self._upgrade()
        return True

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes) -> bool:
        two = _two(output, input)
        if two is None:
            return False
        o, i, dt = two
        lane = self.lane
        shape, ishape = o.shape, i.shape
        if output_split_sizes is None and input_split_sizes is None:
            if not (shape == ishape and shape and not shape[0] % lane.size):  # even: the record has no splits
                return False
            osz = isz = None
        elif shape and ishape and shape[1:] == ishape[1:]:  # uneven: both split lists given
            n = lane.size
            osz = _splits(output_split_sizes, shape[0], n)
            isz = _splits(input_split_sizes, ishape[0], n)
            if osz is None or isz is None or osz[lane.rank] != isz[lane.rank]:
                return False
            if len(shape) != 1:  # (1-D: rows are elements)
                osz, isz = _rows_to_elements(osz, shape), _rows_to_elements(isz, ishape)
        else:
            return False
        run_fields(lane.book, lane.all_to_all_single, i.size, o.size,
                   _ALL_TO_ALL_SINGLE, "cpu", dt, o if o.ndim == 1 else o.reshape(-1),
                   i if i.ndim == 1 else i.reshape(-1), None, None, osz, isz, None, None, None, 0)
        if self.pending:
            self._upgrade()
        return True

    def barrier(self) -> bool:
        lane = self.lane
        run_fields(lane.book, lane.backend.barrier, 0, 0,
                   _BARRIER, "cpu", None, None, None, None, None, None, None, None, None, None, 0)
        if self.pending:
            self._upgrade()
        return True
