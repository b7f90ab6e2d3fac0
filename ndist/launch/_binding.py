"""``--bind-to``: which CPU each local rank is bound to.

``core`` binds each local rank to one CPU of the launcher's own affinity mask
(``os.sched_getaffinity``: never a CPU outside it), a distinct one per rank,
taking one CPU of each physical core before any core's second hardware thread.
``none`` leaves the ranks with the launcher's mask. The default is ``core`` when
the node runs at least two local ranks and has at least as many usable CPUs as
local ranks, ``none`` otherwise (as Open MPI's ``mpirun``, which binds to cores
unless the node is oversubscribed).

Why: two ranks that wait for each other by yielding, then sleeping on a futex,
are runnable one at a time; the kernel's load balancer then sees no imbalance and
can leave both on one core, where every hand-over is a context switch
(docs/performance.md, "Bimodal rounds"). A rank bound to its own core cannot
settle there.

The launcher resolves the choice (``plan``); each rank's bootstrap applies it
(``NDIST_BIND_CPU``) before the program's first line, so every thread the rank
starts inherits it.
"""

from __future__ import annotations

import os

__all__ = ["BIND_TO", "BIND_TO_ENV", "BIND_CPU_ENV", "usable_cpus", "spread_order", "plan"]

#: the values of ``--bind-to``
BIND_TO = ("core", "none")
#: what each rank is told: the launcher's choice (``core`` or ``none``) ...
BIND_TO_ENV = "NDIST_BIND_TO"
#: ... and, when bound, its CPU (the bootstrap binds the rank to it)
BIND_CPU_ENV = "NDIST_BIND_CPU"

_TOPOLOGY = "/sys/devices/system/cpu/cpu{}/topology/{}"


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order (its affinity mask)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def _core_of(cpu: int) -> tuple[int, int] | None:
    """``(package, core)`` of a CPU from sysfs; None where it cannot be read."""
    try:
        with open(_TOPOLOGY.format(cpu, "physical_package_id")) as f:
            package = int(f.read())
        with open(_TOPOLOGY.format(cpu, "core_id")) as f:
            return package, int(f.read())
    except (OSError, ValueError):
        return None


def spread_order(cpus: list[int], core_of=_core_of) -> list[int]:
    """``cpus`` reordered so that the first CPU of every physical core comes before any
    core's second hardware thread (then the third, ...), each tier in CPU order.
    ``core_of(cpu)``: its ``(package, core)``, None when unknown (a core of its own)."""
    seen: dict = {}
    tiers: list[list[int]] = []
    for cpu in cpus:
        key = core_of(cpu)
        key = ("cpu", cpu) if key is None else key
        tier = seen.get(key, 0)
        seen[key] = tier + 1
        while len(tiers) <= tier:
            tiers.append([])
        tiers[tier].append(cpu)
    return [cpu for tier in tiers for cpu in tier]


def plan(bind_to: str | None, nproc: int, cpus: list[int] | None = None) -> tuple[str, tuple[int, ...]]:
    """``(choice, cpu of each local rank)`` for ``--bind-to bind_to`` (None: the default) and
    ``nproc`` local ranks over ``cpus`` (default: this process's mask). The tuple is empty
    for ``none``. Raises ``ValueError`` naming the option for a bad value, or for ``core``
    with more local ranks than usable CPUs."""
    if bind_to is not None and bind_to not in BIND_TO:
        raise ValueError(f"--bind-to: expected 'core' or 'none', got {bind_to!r}")
    cpus = usable_cpus() if cpus is None else cpus
    if bind_to is None:
        bind_to = "core" if 2 <= nproc <= len(cpus) else "none"
    if bind_to == "none":
        return "none", ()
    if nproc > len(cpus):
        shown = ",".join(map(str, cpus))
        raise ValueError(f"--bind-to core: needs a CPU for each of the {nproc} local ranks (--nproc-per-node "
                         f"{nproc}), but the launcher may run on {len(cpus)} CPU(s) ({shown}); use --bind-to none, "
                         "or fewer ranks")
    return "core", tuple(spread_order(cpus)[:nproc])
