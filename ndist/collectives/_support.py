"""``supports_complex(reduceOp)``: whether a reduction is defined on complex tensors."""

from __future__ import annotations

from ._reduce_op import ReduceOp, _PremulSum

__all__ = ["supports_complex"]

_NOT_COMPLEX = frozenset({ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT, ReduceOp.BAND, ReduceOp.BOR,
                          ReduceOp.BXOR})


def supports_complex(reduceOp: ReduceOp) -> bool:  # noqa: N803 - torch's parameter name
    """torch's answer: False for MAX, MIN, PRODUCT and the bitwise ops, True otherwise.

    (ndist's own backends do reduce complex tensors with PRODUCT, except nccl;
    see docs/errors.md. This function keeps torch's answer for ported code.)
    """
    if isinstance(reduceOp, _PremulSum):
        return True
    if not isinstance(reduceOp, ReduceOp):
        raise TypeError(f"reduceOp: expected a ReduceOp, got {type(reduceOp).__name__}")
    return reduceOp not in _NOT_COMPLEX
