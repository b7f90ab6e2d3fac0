"""ndist.tensor: Tensor, dtypes, devices, factories and the ndist.cuda implementation.

Storage is a NumPy array (CPU) or a CuPy array (CUDA); CuPy is imported only when
a CUDA tensor or ``ndist.cuda`` call needs it. This layer imports nothing else of
ndist.
"""

import builtins as _builtins
import sys as _sys

from . import _functional
from ._device import device
from ._dtype import *  # noqa: F403 - the dtype names are listed in _dtype.__all__
from ._dtype import __all__ as _dtype_all
from ._factories import *  # noqa: F403
from ._factories import __all__ as _factories_all
from ._functional import *  # noqa: F403
from ._random import Generator, default_generator, initial_seed, manual_seed, seed
from ._repr import get_printoptions, set_printoptions
from ._tensor import Size, Tensor, is_tensor, max_result, min_result

#: every public name, including torch's builtin-shadowing ones (ndist.int, ndist.max, ...)
PUBLIC = sorted(set(
    _dtype_all + _factories_all + _functional.__all__ + [
        "Tensor", "Size", "device", "is_tensor", "from_dlpack", "Generator",
        "default_generator", "manual_seed", "initial_seed", "seed", "set_printoptions",
        "get_printoptions", "max_result", "min_result",
    ]
))
# ``from ndist import *`` must not replace int / float / bool / max / sum / abs ...
__all__ = [n for n in PUBLIC if not hasattr(_builtins, n)]


class _TensorPackage(type(_functional)):
    """``ndist.tensor`` is this package *and* torch's ``tensor(data, ...)`` factory.

    Making the package callable keeps both meanings without shadowing: after
    ``import ndist``, ``ndist.tensor([1, 2])`` builds a tensor, while
    ``import ndist.tensor._shm as shm`` and ``from ndist.tensor import Tensor``
    still resolve to this package."""

    def __call__(self, data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
        return tensor(data, dtype=dtype, device=device, requires_grad=requires_grad,
                      pin_memory=pin_memory)


def _make_callable() -> None:
    _sys.modules[__name__].__class__ = _TensorPackage


_make_callable()
