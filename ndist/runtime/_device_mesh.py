"""``DeviceMesh`` / ``init_device_mesh``: an n-d array of global ranks with one
process group per mesh dimension, as torch's (2-D data x model parallel:
``mesh["dp"]``, ``mesh.get_group("tp")``).

Every rank builds the mesh with the same arguments (SPMD, as in torch): for
each dimension, one ``new_group`` per 1-d slice of the mesh along it, in the
same order everywhere; each rank keeps the slice that contains it. Slicing a
mesh by dimension names (``mesh["dp"]``, ``mesh["tp", "dp"]``) makes a
sub-mesh that reuses those groups; no group is created after construction.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

__all__ = ["DeviceMesh", "init_device_mesh"]


def _as_int_array(mesh: Any):
    import numpy as np

    if hasattr(mesh, "numpy") and hasattr(mesh, "tolist") and not isinstance(mesh, np.ndarray):
        mesh = mesh.tolist()  # ndist / torch tensors
    arr = np.asarray(mesh)
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"mesh: expected an array of integer global ranks, got dtype {arr.dtype}")
    return arr.astype(np.int64)


def _check_device_type(device_type: Any) -> str:
    if not isinstance(device_type, str) or not device_type.isalpha():
        raise ValueError(f"device_type: expected a device type without an index such as 'cpu' or 'cuda', "
                         f"got {device_type!r}")
    return device_type


def _check_names(names: Any, ndim: int) -> tuple[str, ...] | None:
    if names is None:
        return None
    names = tuple(names)
    if any(not isinstance(n, str) for n in names):
        raise TypeError(f"mesh_dim_names: expected a tuple of str, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"mesh_dim_names: expected unique names, got {names!r}")
    if len(names) != ndim:
        raise ValueError(f"mesh_dim_names: expected {ndim} names (one per mesh dimension), got {len(names)}")
    return names


class DeviceMesh:
    """An n-d layout of global ranks on ``device_type`` with a ProcessGroup per dimension."""

    def __init__(self, device_type: str, mesh: Any, *, mesh_dim_names: Sequence[str] | None = None,
                 backend_override: Sequence[Any] | None = None, _init_backend: bool = True) -> None:
        from ._world import get_rank, get_world_size, resolve_group

        self._device_type = _check_device_type(device_type)
        arr = _as_int_array(mesh)
        if arr.ndim == 0 or arr.size == 0:
            raise ValueError(f"mesh: expected a non-empty array of global ranks, got {arr.tolist()!r}")
        self._mesh = arr
        self._mesh_dim_names = _check_names(mesh_dim_names, arr.ndim)
        self._rank = get_rank()
        self._groups: list[Any] = [None] * arr.ndim
        if not _init_backend:
            return
        world = get_world_size()
        flat = arr.reshape(-1).tolist()
        if len(set(flat)) != len(flat) or min(flat) < 0 or max(flat) >= world:
            raise ValueError(f"mesh: expected distinct global ranks in [0, {world}), got {arr.tolist()}")
        overrides = tuple(backend_override) if backend_override is not None else (None,) * arr.ndim
        if len(overrides) != arr.ndim:
            raise ValueError(f"backend_override: expected {arr.ndim} entries (one per mesh dimension), "
                             f"got {len(overrides)}")
        if all(o is None for o in overrides) and device_type not in resolve_group(None).backend_names:
            raise ValueError(f"device_type: the default group has no backend for {device_type!r} "
                             f"(it has {resolve_group(None).backend_name()!r})")
        self._groups = [self._make_groups(d, overrides[d]) for d in range(arr.ndim)]

    def _make_groups(self, dim: int, override: Any):
        from ._world import new_group

        import numpy as np

        backend, options = override if isinstance(override, tuple) else (override, None)
        if backend is not None and not isinstance(backend, str):
            backend, options = None, backend
        rows = np.moveaxis(self._mesh, dim, -1).reshape(-1, self._mesh.shape[dim])
        mine = None
        for row in rows:  # the same new_group calls, in the same order, on every rank
            pg = new_group(row.tolist(), backend=backend, pg_options=options)
            if self._rank in row:
                mine = pg
        return mine

    # ----------------------------------------------------------------- facts
    @property
    def device_type(self) -> str:
        return self._device_type

    @property
    def mesh(self):
        """The mesh as an ``ndist.Tensor`` of int (global ranks)."""
        from ..tensor import tensor

        return tensor(self._mesh.tolist())

    @property
    def mesh_dim_names(self) -> tuple[str, ...] | None:
        return self._mesh_dim_names

    @property
    def ndim(self) -> int:
        return self._mesh.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._mesh.shape)

    def size(self, mesh_dim: int | None = None) -> int:
        return self._mesh.size if mesh_dim is None else self._mesh.shape[self._dim(mesh_dim)]

    def get_rank(self) -> int:
        """This process's global rank."""
        return self._rank

    def get_coordinate(self) -> tuple[int, ...] | None:
        """This rank's index in the mesh, or ``None`` when the mesh does not contain it."""
        import numpy as np

        where = np.argwhere(self._mesh == self._rank)
        return tuple(int(i) for i in where[0]) if len(where) else None

    def _dim(self, mesh_dim: int | str) -> int:
        if isinstance(mesh_dim, str):
            if not self._mesh_dim_names or mesh_dim not in self._mesh_dim_names:
                raise KeyError(f"mesh_dim: {mesh_dim!r} is not a dimension name of this mesh "
                               f"(names: {self._mesh_dim_names})")
            return self._mesh_dim_names.index(mesh_dim)
        if isinstance(mesh_dim, bool) or not isinstance(mesh_dim, int) or not -self.ndim <= mesh_dim < self.ndim:
            raise ValueError(f"mesh_dim: expected a dimension name or an int in [0, {self.ndim}), got {mesh_dim!r}")
        return mesh_dim % self.ndim

    # ---------------------------------------------------------------- groups
    def get_group(self, mesh_dim: int | str | None = None):
        """The ProcessGroup of ``mesh_dim`` that contains this rank (``mesh_dim`` may
        be omitted on a 1-d mesh)."""
        if mesh_dim is None:
            if self.ndim > 1:
                raise RuntimeError(f"Found the DeviceMesh have {self.ndim} dimensions: mesh_dim needs to be "
                                   f"specified when device_mesh.ndim > 1 (get_all_groups() returns them all)")
            mesh_dim = 0
        group = self._groups[self._dim(mesh_dim)]
        if group is None:
            raise RuntimeError(f"DeviceMesh: global rank {self._rank} is not part of this mesh "
                               f"{self._mesh.tolist()}, so it has no group")
        return group

    def get_all_groups(self) -> list:
        return [self.get_group(d) for d in range(self.ndim)]

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's rank in the group of ``mesh_dim``."""
        return self.get_group(mesh_dim).rank()

    def __getitem__(self, mesh_dim_names: str | tuple[str, ...]) -> "DeviceMesh":
        """The sub-mesh of the named dimensions that contains this rank, with their groups."""
        if not self._mesh_dim_names:
            raise RuntimeError("Cannot slice a DeviceMesh without mesh_dim_names!")
        names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
        if names == self._mesh_dim_names:
            return self
        dims = [self._dim(n) for n in names]
        if len(set(dims)) != len(dims):
            raise ValueError(f"mesh_dim_names: expected distinct names, got {names!r}")
        coord = self.get_coordinate() or (0,) * self.ndim
        index = tuple(slice(None) if d in dims else coord[d] for d in range(self.ndim))
        kept = [d for d in range(self.ndim) if d in dims]  # the order of the axes after indexing
        sub = self._mesh[index].transpose([kept.index(d) for d in dims])
        child = DeviceMesh(self._device_type, sub, mesh_dim_names=names, _init_backend=False)
        child._groups = [self._groups[d] for d in dims]
        return child

    # ------------------------------------------------------------ the rest
    def __enter__(self) -> "DeviceMesh":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def _key(self):
        return (self._device_type, self.shape, tuple(self._mesh.reshape(-1).tolist()), self._mesh_dim_names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        shape = (f"({', '.join(f'{k}={v}' for k, v in zip(self._mesh_dim_names, self.shape))})"
                 if self._mesh_dim_names else f"{self.shape}")
        stride = tuple(s // self._mesh.itemsize for s in self._mesh.strides)
        return f"DeviceMesh({shape}, '{self._device_type}', stride={stride})"


def _overrides(backend_override: Mapping[Any, Any] | None, ndim: int, names: tuple[str, ...] | None):
    if backend_override is None:
        return None
    if not isinstance(backend_override, Mapping):
        raise TypeError(f"backend_override: expected a dict of mesh dimension -> backend, "
                        f"got {type(backend_override).__name__}")
    out: list[Any] = [None] * ndim
    for key, value in backend_override.items():
        if isinstance(key, str):
            if not names or key not in names:
                raise ValueError(f"backend_override: {key!r} is not a mesh dimension name (names: {names})")
            dim = names.index(key)
        elif isinstance(key, int) and not isinstance(key, bool) and -ndim <= key < ndim:
            dim = key % ndim
        else:
            raise ValueError(f"backend_override: expected dimension indices or names as keys, got {key!r}")
        if out[dim] is not None:
            raise ValueError(f"backend_override: dimension {dim} is given twice")
        out[dim] = value
    return tuple(out)


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *, mesh_dim_names: Sequence[str] | None = None,
                     backend_override: Mapping[Any, Any] | None = None) -> DeviceMesh:
    """A mesh of ``mesh_shape`` over all ranks in order (``arange(world).reshape(mesh_shape)``),
    initialising the default group first if needed (as torch)."""
    import numpy as np

    from ._world import get_world_size, init_process_group, is_initialized

    _check_device_type(device_type)
    if isinstance(mesh_shape, int) or not hasattr(mesh_shape, "__iter__"):
        raise TypeError(f"mesh_shape: expected a tuple of int, got {type(mesh_shape).__name__}")
    shape = tuple(mesh_shape)
    if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in shape):
        raise ValueError(f"mesh_shape: expected a tuple of positive ints, got {mesh_shape!r}")
    names = _check_names(mesh_dim_names, len(shape))
    overrides = _overrides(backend_override, len(shape), names)
    if not is_initialized():
        init_process_group()
    world = get_world_size()
    if math.prod(shape) != world:
        raise ValueError(f"mesh_shape: expected a shape of {world} ranks (the world size), got {shape} "
                         f"({math.prod(shape)} ranks)")
    return DeviceMesh(device_type, np.arange(world).reshape(shape), mesh_dim_names=names, backend_override=overrides)
