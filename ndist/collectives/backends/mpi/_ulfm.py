"""What this MPI offers of ULFM (User Level Failure Mitigation), found at run time.

``shrink_group`` on the mpi backend would need MPI's ULFM: an error (not a hang, not
an abort) from an operation that involves a dead rank, ``Comm.Revoke`` to release the
survivors still waiting, and ``Comm.Shrink`` for a communicator of the survivors.
``shrink_refusal`` says why ndist refuses to shrink an mpi group, naming what this
install lacks; docs/errors.md ("Rank loss") records the experiment behind it
(mpi4py 4.1.2 over MPICH 5.0.2 from PyPI).

The probe sends nothing: it revokes a duplicate of ``COMM_SELF`` and frees it.
"""

from __future__ import annotations

import os

__all__ = ["shrink_refusal", "missing_parts"]

#: the environment variables that turn MPICH's fault tolerance on (one CVAR, three spellings)
_MPICH_FT_VARS = ("MPIR_CVAR_ENABLE_FT", "MPICH_ENABLE_FT", "MPIR_PARAM_ENABLE_FT")


def _revoke_gap(MPI) -> str | None:
    """Why ``Comm.Revoke`` is unusable here, or None when a revoke of a private
    communicator (a duplicate of ``COMM_SELF``) succeeds."""
    if not hasattr(MPI.Comm, "Revoke"):
        return "its Comm has no Revoke"
    comm = MPI.COMM_SELF.Dup()
    try:
        comm.Revoke()
    except NotImplementedError:
        return "Comm.Revoke raises NotImplementedError"
    except MPI.Exception as err:
        return f"MPI_Comm_revoke failed: {err.Get_error_string()}"
    finally:
        try:
            comm.Free()
        except Exception:  # noqa: BLE001 - a probe must not raise
            pass
    return None


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() not in ("", "0", "no", "false", "off")


def missing_parts() -> list[str]:
    """What this install lacks for ULFM, one phrase each (``[]``: nothing found missing)."""
    import mpi4py
    from mpi4py import MPI

    gaps = []
    revoke = _revoke_gap(MPI)
    if revoke is not None:
        gaps.append(f"mpi4py {mpi4py.__version__} does not bind the library's ULFM calls ({revoke}; without them "
                    "mpi4py's Comm.Shrink is a plain MPI_Comm_dup that keeps the dead ranks and Comm.Get_failed is "
                    "always empty)")
    if MPI.ERR_PROC_FAILED == MPI.ERR_REVOKED:
        gaps.append(f"MPI.ERR_PROC_FAILED and MPI.ERR_REVOKED are the same class ({MPI.ERR_PROC_FAILED}"
                    f"{', the class of an unknown error' if MPI.ERR_PROC_FAILED == MPI.ERR_UNKNOWN else ''}), so a "
                    "rank's failure cannot be told from a revoke")
    library = MPI.Get_library_version()
    if library.startswith("MPICH") and not any(_truthy(os.environ.get(v)) for v in _MPICH_FT_VARS):
        gaps.append("MPICH's fault tolerance is off (MPIR_CVAR_ENABLE_FT is not set; MPICH 5.0.2's PyPI build "
                    "aborts in MPI_Init with 2 or more ranks when it is)")
    if library.startswith("MPICH") and "5.0.2" in library.split("\n", 1)[0]:
        gaps.append("MPICH 5.0.2's mpiexec (Hydra) ends the other ranks when one dies, -disable-auto-cleanup "
                    "notwithstanding (seen, not probed)")
    return gaps


def shrink_refusal() -> str:
    """Why ``shrink_group`` refuses a group on the mpi backend, found on this install."""
    try:
        from mpi4py import MPI

        first = MPI.Get_library_version().strip().split("\n", 1)[0]
        library = " ".join(w for w in first.split() if w != "Version:") or "this MPI"
        gaps = missing_parts()
    except Exception as err:  # noqa: BLE001 - the refusal must still say what it can
        library, gaps = "this MPI", [f"probing it failed ({type(err).__name__}: {err})"]
    if gaps:
        return (f"ndist's mpi backend could shrink only through MPI's ULFM (revoke, shrink), and {library} has "
                "none usable here: " + "; ".join(gaps) + " (docs/errors.md, 'Rank loss'). Use the socket backend "
                "to shrink")
    return (f"ndist's mpi backend does not use MPI's ULFM yet, although {library} seems to offer it here "
            "(docs/errors.md, 'Rank loss'). Use the socket backend to shrink")
