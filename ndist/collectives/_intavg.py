"""AVG's last step on integer tensors: the group's sum divided by its size, toward zero.

NCCL's ``ncclAvg`` on an integer type adds in that type (wrapping as ``ncclSum``
does) and divides the final sum by the number of ranks, truncating toward zero
(it divides the absolute value and puts the sign back). torch's NCCL backend
passes integer AVG straight to it. Every ndist backend does the same: the sum is
the one SUM computes, overflow included, and this function divides it.

Works on NumPy and CuPy arrays alike (operators and ``astype`` only).
"""

from __future__ import annotations

import numpy as np

__all__ = ["truncating_divide"]


def truncating_divide(out, size: int) -> None:
    """``out = trunc(out / size)`` in place, exactly, for an integer array ``out``.

    Below 64 bits the quotient is taken in int64, where ``size`` and every value fit
    (an int8 sum divided by a world of 200 ranks is 0, not an overflow). The result's
    magnitude never exceeds the input's, so it always fits back into ``out``'s dtype.
    """
    if size == 1 or out.size == 0:
        return
    x = out if out.dtype.itemsize == 8 else out.astype(np.int64)
    q = x // size  # floor
    if x.dtype.kind == "i":
        # floor -> toward zero: a negative value with a remainder moves up by one
        q += (x < 0) & (x % size != 0)
    out[...] = q
