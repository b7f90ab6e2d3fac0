"""Random number generators: one NumPy generator for the CPU, one CuPy per GPU."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import _dtype as D
from ._cuda import current_device, device_count, index_guard, require_cupy
from ._device import CPU, to_device

__all__ = ["Generator", "default_generator", "manual_seed", "initial_seed", "seed", "cuda_manual_seed",
           "cuda_manual_seed_all"]


def _entropy() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 1  # 63 random bits


class Generator:
    """A CPU random generator (``ndist.Generator``), seedable like torch's."""

    def __init__(self, device: Any = "cpu") -> None:
        if to_device(device).type != "cpu":
            raise ValueError(f"Generator: device must be 'cpu' (CUDA generators are per device "
                             f"and seeded with ndist.cuda.manual_seed), got {device!r}")
        self._seed = _entropy()
        self._numpy_rng = None  # made on first use: numpy.random costs every import ~5 ms

    @property
    def _rng(self) -> np.random.Generator:
        rng = self._numpy_rng
        if rng is None:
            rng = self._numpy_rng = np.random.default_rng(self._seed)
        return rng

    @property
    def device(self):
        return CPU

    def manual_seed(self, seed: int) -> "Generator":
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"manual_seed: seed must be an int, got {type(seed).__name__}")
        self._seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        self._numpy_rng = None  # reseeded on next use
        return self

    def initial_seed(self) -> int:
        return self._seed

    def seed(self) -> int:
        self.manual_seed(_entropy())
        return self._seed

    def get_state(self) -> dict:
        return self._rng.bit_generator.state

    def set_state(self, state: dict) -> "Generator":
        self._rng.bit_generator.state = state
        return self


default_generator = Generator()
_cuda_states: dict[int, Any] = {}  # GPU index -> cupy.random.RandomState
_cuda_seed = [None]


def seed_cuda(seed: int, index: int) -> None:
    cp = require_cupy()
    with index_guard(index):
        _cuda_states[index] = cp.random.RandomState(seed)


def manual_seed(seed: int) -> Generator:
    """Seed the CPU generator and every CUDA generator (created lazily)."""
    default_generator.manual_seed(seed)
    _cuda_seed[0] = default_generator.initial_seed()
    _cuda_states.clear()
    return default_generator


def initial_seed() -> int:
    return default_generator.initial_seed()


def seed() -> int:
    s = default_generator.seed()
    _cuda_seed[0] = s
    _cuda_states.clear()
    return s


def _cuda_state(index: int):
    st = _cuda_states.get(index)
    if st is None:
        s = _cuda_seed[0]
        seed_cuda(_entropy() if s is None else s + index, index)
        st = _cuda_states[index]
    return st


def _gen(generator: Generator | None) -> np.random.Generator:
    if generator is None:
        return default_generator._rng
    if not isinstance(generator, Generator):
        raise TypeError(f"generator: expected an ndist.Generator, got {type(generator).__name__}")
    return generator._rng


def _real(dt: D.dtype) -> np.dtype:
    # NumPy generators make float32/float64 only; others are cast afterwards.
    return np.float64 if dt is D.float64 else np.float32


def uniform(shape: tuple, dt: D.dtype, dev, generator=None):
    """Uniform [0, 1) samples as an array on ``dev``."""
    if not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"rand: dtype must be floating point or complex, got {dt}")
    real = dt.to_real()
    if dev.type == "cuda":
        with index_guard(dev.index):
            st = _cuda_state(dev.index)
            out = st.random_sample(shape + ((2,) if dt.is_complex else ()), dtype=_real(real))
            if dt.is_complex:
                out = out[..., 0] + 1j * out[..., 1]
            return out.astype(dt.numpy_dtype, copy=False)
    rng = _gen(generator)
    out = rng.random(shape + ((2,) if dt.is_complex else ()), dtype=_real(real))
    if dt.is_complex:
        out = out[..., 0] + 1j * out[..., 1]
    return out.astype(dt.numpy_dtype, copy=False)


def normal(shape: tuple, dt: D.dtype, dev, generator=None):
    """Standard normal samples (complex: real and imaginary parts each of variance 1/2)."""
    if not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"randn: dtype must be floating point or complex, got {dt}")
    real = dt.to_real()
    extra = (2,) if dt.is_complex else ()
    if dev.type == "cuda":
        with index_guard(dev.index):
            out = _cuda_state(dev.index).standard_normal(shape + extra, dtype=_real(real))
            if dt.is_complex:
                out = (out[..., 0] + 1j * out[..., 1]) * np.sqrt(0.5)
            return out.astype(dt.numpy_dtype, copy=False)
    out = _gen(generator).standard_normal(shape + extra, dtype=_real(real))
    if dt.is_complex:
        out = (out[..., 0] + 1j * out[..., 1]) * np.sqrt(0.5)
    return out.astype(dt.numpy_dtype, copy=False)


def integers(low: int, high: int, shape: tuple, dt: D.dtype, dev, generator=None):
    """Integers uniform in [low, high)."""
    if high <= low:
        raise ValueError(f"randint: expected low < high, got low={low} and high={high}")
    if dev.type == "cuda":
        with index_guard(dev.index):
            out = _cuda_state(dev.index).randint(low, high, size=shape, dtype=np.int64)
            return out.astype(dt.numpy_dtype, copy=False)
    out = _gen(generator).integers(low, high, size=shape, dtype=np.int64)
    return out.astype(dt.numpy_dtype, copy=False)


def cuda_manual_seed(seed: int) -> None:
    """Seed the random generator of the current CUDA device (``ndist.cuda.manual_seed``)."""
    seed_cuda(int(seed), current_device())


def cuda_manual_seed_all(seed: int) -> None:
    """Seed the random generators of every CUDA device (``ndist.cuda.manual_seed_all``)."""
    for i in range(device_count()):
        seed_cuda(int(seed), i)
