"""Function forms of Tensor methods (``ndist.sum(t, dim=0)`` == ``t.sum(dim=0)``)."""

from __future__ import annotations

from typing import Any, Callable

from ._factories import as_tensor
from ._tensor import Tensor

_BINARY = ("add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide",
           "floor_divide", "remainder", "fmod", "pow", "matmul", "maximum", "minimum",
           "eq", "ne", "lt", "le", "gt", "ge", "greater", "less", "greater_equal", "less_equal",
           "not_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
           "bitwise_xor", "isclose", "allclose", "equal")
_UNARY = ("neg", "negative", "abs", "absolute", "sqrt", "exp", "log", "log2", "log10", "sin",
          "cos", "tan", "tanh", "sigmoid", "floor", "ceil", "trunc", "round", "sign", "square",
          "reciprocal", "isnan", "isinf", "isfinite", "logical_not", "bitwise_not", "clamp", "clip",
          "sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "any", "all",
          "std", "var", "cumsum", "norm", "reshape", "flatten", "unflatten", "permute",
          "transpose", "swapaxes", "squeeze", "unsqueeze", "chunk", "split", "tensor_split",
          "unbind", "narrow", "flip", "t", "clone", "numel", "is_floating_point", "is_complex")

__all__ = list(_BINARY + _UNARY)


def _make(name: str, binary: bool) -> Callable[..., Any]:
    def fn(input: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A002 - torch's name
        if not isinstance(input, Tensor):
            if binary and args and isinstance(args[0], Tensor):
                input = as_tensor(input, device=args[0].device)
            else:
                raise TypeError(f"{name}(): argument 'input' must be an ndist.Tensor, "
                                f"not {type(input).__name__}")
        return getattr(input, name)(*args, **kwargs)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``ndist.{name}(input, ...)`` is ``input.{name}(...)``."
    return fn


for _n in _BINARY:
    globals()[_n] = _make(_n, True)
for _n in _UNARY:
    globals()[_n] = _make(_n, False)
del _n
