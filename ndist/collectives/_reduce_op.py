"""ReduceOp: the closed set of reductions, as in torch.distributed."""

from __future__ import annotations

import enum

__all__ = ["ReduceOp"]


class ReduceOp(enum.Enum):
    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVG = "avg"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"
    PREMUL_SUM = "premul_sum"

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}"

    __str__ = __repr__


class _PremulSum:
    """``PREMUL_SUM`` bound to its factor, as built by ``_make_nccl_premul_sum``.

    Backends see ``ReduceOp.PREMUL_SUM`` plus a ``scale`` argument; this object
    only carries the factor from the user to the argument checker.
    """

    __slots__ = ("factor",)

    def __init__(self, factor):
        self.factor = factor

    def __repr__(self) -> str:
        return f"ReduceOp.PREMUL_SUM({self.factor!r})"


def _make_nccl_premul_sum(factor) -> _PremulSum:
    """``PREMUL_SUM`` with ``factor``: multiply each input by ``factor``, then sum."""
    return _PremulSum(factor)
