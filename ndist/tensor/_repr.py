"""Tensor repr, following torch's ``_tensor_str`` rules.

Integers print as they are (``tensor([0, 1, 2])``); floats whose values are all
whole print with a trailing dot (``tensor([1., 2.])``), others with 4 decimals
(``tensor([0.5000, 1.0000])``) or in scientific notation when the range is wide;
complex numbers format the real and imaginary parts each that way
(``tensor([1.+1.j])``). Elements are right-aligned to one width, long tensors
are summarised with ``...``, and a non-default dtype or a CUDA device is
appended as ``dtype=ndist.int32`` / ``device='cuda:0'``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _dtype as D

__all__ = ["set_printoptions", "get_printoptions"]


class _PrintOptions:
    def __init__(self) -> None:
        self.precision: int = 4
        self.threshold: float = 1000
        self.edgeitems: int = 3
        self.linewidth: int = 80
        self.sci_mode: bool | None = None


_OPTS = _PrintOptions()


def set_printoptions(precision: int | None = None, threshold: float | None = None,
                     edgeitems: int | None = None, linewidth: int | None = None,
                     profile: str | None = None, sci_mode: bool | None = None) -> None:
    """Like torch.set_printoptions: profile is 'default', 'short' or 'full'."""
    if profile is not None:
        presets = {"default": (4, 1000, 3, 80), "short": (2, 1000, 2, 80),
                   "full": (4, math.inf, 3, 80)}
        if profile not in presets:
            raise ValueError(f"profile: expected one of {sorted(presets)}, got {profile!r}")
        _OPTS.precision, _OPTS.threshold, _OPTS.edgeitems, _OPTS.linewidth = presets[profile]
    for name, value in (("precision", precision), ("threshold", threshold),
                        ("edgeitems", edgeitems), ("linewidth", linewidth)):
        if value is not None:
            setattr(_OPTS, name, value)
    _OPTS.sci_mode = sci_mode


def get_printoptions() -> dict:
    return dict(vars(_OPTS))


class _Formatter:
    def __init__(self, values: np.ndarray) -> None:
        self.floating = values.dtype.kind == "f"
        self.int_mode = True
        self.sci_mode = False
        self.max_width = 1
        p = _OPTS.precision
        flat = values.reshape(-1)
        if not self.floating:
            for v in flat.tolist():
                self.max_width = max(self.max_width, len(str(v)))
            return
        finite = flat[np.isfinite(flat) & (flat != 0)].astype(np.float64)
        if finite.size == 0:
            return
        absval = np.abs(finite)
        lo, hi = float(absval.min()), float(absval.max())
        self.int_mode = bool(np.all(finite == np.ceil(finite)))
        vals = finite.tolist()
        if self.int_mode:
            if hi / lo > 1000.0 or hi > 1.0e8:
                self.sci_mode = True
                self.max_width = max(len(f"{v:.{p}e}") for v in vals)
            else:
                self.max_width = max(len(f"{v:.0f}") + 1 for v in vals)
        else:
            if hi / lo > 1000.0 or hi > 1.0e8 or lo < 1.0e-4:
                self.sci_mode = True
                self.max_width = max(len(f"{v:.{p}e}") for v in vals)
            else:
                self.max_width = max(len(f"{v:.{p}f}") for v in vals)
        if _OPTS.sci_mode is not None:
            self.sci_mode = _OPTS.sci_mode

    def format(self, value: Any) -> str:
        p = _OPTS.precision
        if self.floating:
            if self.sci_mode:
                ret = f"{value:{self.max_width}.{p}e}"
            elif self.int_mode:
                ret = f"{value:.0f}"
                if not (math.isinf(value) or math.isnan(value)):
                    ret += "."
            else:
                ret = f"{value:.{p}f}"
        else:
            ret = str(value)
        return (self.max_width - len(ret)) * " " + ret


def _summarize(arr: np.ndarray) -> np.ndarray:
    """The edge items torch shows of a summarised tensor (for the formatter widths)."""
    e = _OPTS.edgeitems
    if arr.ndim == 0:
        return arr
    if arr.ndim == 1:
        return np.concatenate((arr[:e], arr[-e:])) if arr.shape[0] > 2 * e else arr
    rows = list(arr[:e]) + list(arr[-e:]) if arr.shape[0] > 2 * e else list(arr)
    return np.stack([_summarize(r) for r in rows])


def _fmt_value(v: Any, f1: _Formatter, f2: _Formatter | None) -> str:
    if f2 is None:
        return f1.format(v)
    real = f1.format(v.real)
    imag = (f2.format(v.imag) + "j").lstrip()
    return real + imag if imag[0] in "+-" else real + "+" + imag


def _vector(arr: np.ndarray, indent: int, summarize: bool, f1, f2) -> str:
    element_length = f1.max_width + 2 + (f2.max_width + 1 if f2 is not None else 0)
    per_line = max(1, int(math.floor((_OPTS.linewidth - indent) / element_length)))
    e = _OPTS.edgeitems
    if summarize and arr.shape[0] > 2 * e:
        data = [_fmt_value(v, f1, f2) for v in arr[:e].tolist()] + [" ..."] + \
               [_fmt_value(v, f1, f2) for v in arr[-e:].tolist()]
    else:
        data = [_fmt_value(v, f1, f2) for v in arr.tolist()]
    lines = [", ".join(data[i:i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + ("," + "\n" + " " * (indent + 1)).join(lines) + "]"


def _nested(arr: np.ndarray, indent: int, summarize: bool, f1, f2) -> str:
    if arr.ndim == 0:
        return _fmt_value(arr.tolist(), f1, f2)
    if arr.ndim == 1:
        return _vector(arr, indent, summarize, f1, f2)
    e = _OPTS.edgeitems
    if summarize and arr.shape[0] > 2 * e:
        parts = [_nested(arr[i], indent + 1, summarize, f1, f2) for i in range(e)] + ["..."] + \
                [_nested(arr[i], indent + 1, summarize, f1, f2)
                 for i in range(arr.shape[0] - e, arr.shape[0])]
    else:
        parts = [_nested(arr[i], indent + 1, summarize, f1, f2) for i in range(arr.shape[0])]
    return "[" + ("," + "\n" * (arr.ndim - 1) + " " * (indent + 1)).join(parts) + "]"


def _body(arr: np.ndarray, indent: int) -> str:
    if arr.size == 0:
        return "[]"
    summarize = arr.size > _OPTS.threshold
    if arr.dtype.kind == "f" and arr.dtype.itemsize < 4 or arr.dtype.name == "bfloat16":
        arr = arr.astype(np.float32)
    if arr.dtype.kind == "c":
        src_r, src_i = (_summarize(arr.real), _summarize(arr.imag)) if summarize else (arr.real, arr.imag)
        return _nested(arr, indent, summarize, _Formatter(src_r), _Formatter(src_i))
    return _nested(arr, indent, summarize, _Formatter(_summarize(arr) if summarize else arr), None)


def _add_suffixes(text: str, suffixes: list[str], indent: int) -> str:
    parts = [text]
    last_line_len = len(text) - text.rfind("\n") + 1
    for suffix in suffixes:
        if last_line_len + len(suffix) + 2 > _OPTS.linewidth:
            parts.append(",\n" + " " * indent + suffix)
            last_line_len = indent + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line_len += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


def tensor_repr(arr: np.ndarray, dt: D.dtype, dev: Any) -> str:
    """``tensor([...])`` with torch's layout, plus device / dtype suffixes: ``arr`` is
    the tensor's values in host memory, ``dt`` its dtype and ``dev`` its device."""
    prefix = "tensor("
    indent = len(prefix)
    suffixes = []
    if dev.type == "cuda":
        suffixes.append(f"device='{dev}'")
    default = D.get_default_dtype()
    if arr.size == 0:
        if arr.ndim != 1:
            suffixes.append(f"size={tuple(arr.shape)}")
        if dt is not default:
            suffixes.append(f"dtype={dt}")
    elif dt not in (default, default.to_complex(), D.int64, D.bool):
        suffixes.append(f"dtype={dt}")
    return _add_suffixes(prefix + _body(arr, indent), suffixes, indent)
