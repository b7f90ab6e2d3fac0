"""Where this process sits in the job, read from its environment.

Sources, in order of precedence:

1. ``RANK`` / ``WORLD_SIZE`` (``ndistrun``, ``torchrun``, or set by hand);
2. an MPI launcher: Open MPI (``OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE``),
   MPICH / Hydra and Intel MPI (``PMI_RANK``/``PMI_SIZE``, ``MPI_LOCALRANKID``/
   ``MPI_LOCALNRANKS``), PMIx (``PMIX_RANK`` with a size from one of the above);
3. a Slurm job step started by ``srun`` (``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``
   or ``SLURM_NTASKS``, ``SLURM_LOCALID``); ``MASTER_ADDR`` defaults to the first
   host of ``SLURM_STEP_NODELIST``/``SLURM_JOB_NODELIST`` and ``MASTER_PORT``
   to a port derived from the job id.

Nothing here writes ``os.environ``; ``detect()`` takes a mapping so tests can
pass their own.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

__all__ = ["JobEnv", "detect", "first_host", "STORE_ENV", "RESTART_ENV", "REPLACES_ENV", "REPLACEMENT_ENV"]

STORE_ENV = "NDIST_STORE"  # "host:port" of a store hosted by the launcher (ndistrun)
RESTART_ENV = "NDIST_RESTART_COUNT"
REPLACES_ENV = "NDIST_REPLACES"  # ndistrun --on-failure replace: the rank a newcomer replaces
REPLACEMENT_ENV = "NDIST_REPLACEMENT"  # ... and which replacement of it it is (1 first)


@dataclass(frozen=True)
class JobEnv:
    """Rank facts found in the environment; ``None`` where a source did not say."""

    source: str | None  # "env", "mpi", "slurm" or None
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    agent_store: str | None = None  # host:port of a launcher-hosted store
    restart_count: int = 0
    #: a process started in a lost rank's place (``ndistrun --on-failure replace``): the rank it
    #: replaces (None: one of the job's first processes) and its replacement number
    replaces: int | None = None
    replacement: int = 0

    @property
    def under_mpi(self) -> bool:
        return self.source == "mpi"


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}: expected an integer, got {raw!r}") from None
    return None


def first_host(nodelist: str) -> str:
    """The first host name of a Slurm host list: ``"gpu[03-05,9],cpu1"`` -> ``"gpu03"``."""
    nodelist = nodelist.strip()
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        raise ValueError(f"SLURM_JOB_NODELIST: cannot parse host list {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _mpi(env: Mapping[str, str]) -> tuple[int, int, int | None, int | None] | None:
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        return (
            _int(env, "OMPI_COMM_WORLD_RANK"),
            _int(env, "OMPI_COMM_WORLD_SIZE"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
        )
    size = _int(env, "PMI_SIZE", "PMIX_SIZE", "MPI_WORLDSIZE")
    rank = _int(env, "PMI_RANK", "PMIX_RANK", "MPI_RANKID")
    if rank is not None and size is not None:
        return rank, size, _int(env, "MPI_LOCALRANKID", "PMI_LOCAL_RANK"), _int(env, "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")
    return None


def _slurm(env: Mapping[str, str]) -> tuple[int, int, int | None, int | None] | None:
    # Only a job *step* (srun) has one process per task; a batch script also sees
    # SLURM_PROCID=0 and SLURM_NTASKS=N but is a single process.
    if "SLURM_PROCID" not in env or not ("SLURM_STEP_ID" in env or "SLURM_STEPID" in env):
        return None
    size = _int(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS")
    if size is None:
        return None
    local_size = None
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if per_node:
        m = re.match(r"(\d+)", per_node)
        local_size = int(m.group(1)) if m else None
    return _int(env, "SLURM_PROCID"), size, _int(env, "SLURM_LOCALID"), local_size


def detect(env: Mapping[str, str] | None = None) -> JobEnv:
    """Read rank, world size, local rank and the master's address from ``env``."""
    env = os.environ if env is None else env
    master_addr = env.get("MASTER_ADDR") or None
    master_port = _int(env, "MASTER_PORT")
    restart = _int(env, RESTART_ENV) or 0
    agent_store = env.get(STORE_ENV) or None
    common = dict(master_addr=master_addr, master_port=master_port, agent_store=agent_store, restart_count=restart,
                  replaces=_int(env, REPLACES_ENV), replacement=_int(env, REPLACEMENT_ENV) or 0)

    if "RANK" in env or "WORLD_SIZE" in env:
        return JobEnv(
            "env",
            rank=_int(env, "RANK"),
            world_size=_int(env, "WORLD_SIZE"),
            local_rank=_int(env, "LOCAL_RANK"),
            local_world_size=_int(env, "LOCAL_WORLD_SIZE"),
            **common,
        )
    found = _mpi(env)
    if found is not None:
        rank, size, lrank, lsize = found
        return JobEnv("mpi", rank, size, lrank, lsize, **common)
    found = _slurm(env)
    if found is not None:
        rank, size, lrank, lsize = found
        if master_addr is None:
            nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            if nodes:
                common["master_addr"] = first_host(nodes)
        if master_port is None:
            job = _int(env, "SLURM_JOB_ID", "SLURM_JOBID")
            if job is not None:
                # Every task of the step derives the same port; spread over 20000-39999.
                common["master_port"] = 20000 + job % 20000
        return JobEnv("slurm", rank, size, lrank, lsize, **common)
    return JobEnv(None, **common)
