"""ndist.tensor: Tensor, dtypes, devices, factories and the ndist.cuda implementation.

Storage is a NumPy array (CPU) or a CuPy array (CUDA); CuPy is imported only when
a CUDA tensor or ``ndist.cuda`` call needs it. This layer imports nothing else of
ndist.
"""

from . import _functional
from ._device import device
from ._dlpack import from_dlpack
from ._dtype import *  # noqa: F403 - the dtype names are listed in _dtype.__all__
from ._dtype import __all__ as _dtype_all
from ._factories import *  # noqa: F403
from ._factories import __all__ as _factories_all
from ._functional import *  # noqa: F403
from ._ops import max_result, min_result
from ._random import Generator, default_generator, initial_seed, manual_seed, seed
from ._repr import get_printoptions, set_printoptions
from ._tensor import Size, Tensor, is_tensor

__all__ = sorted(set(
    _dtype_all + _factories_all + _functional.__all__ + [
        "Tensor", "Size", "device", "is_tensor", "from_dlpack", "Generator",
        "default_generator", "manual_seed", "initial_seed", "seed", "set_printoptions",
        "get_printoptions", "max_result", "min_result",
    ]
))
