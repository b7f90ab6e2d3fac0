"""``--bind-to``: which CPUs each local rank is bound to.

``core`` binds each local rank to CPUs of its own, taken from the launcher's own
affinity mask (``os.sched_getaffinity``: never a CPU outside it): the mask's physical
cores are dealt out in equal, disjoint blocks of whole cores (a core's hardware
threads stay together), so that a rank's own threads (OpenMP, torch's intra-op pool,
a DataLoader's workers) still have every core of its share. With fewer cores than
ranks but enough CPUs (hardware threads), each rank gets one CPU, one thread of each
core first. ``core:N`` gives each rank exactly N whole cores (as Hydra's
``-bind-to core:N``). ``core:overload-allowed`` (Open MPI's qualifier) also binds when there
are more local ranks than CPUs: one CPU each, dealt round-robin in that same order, so that
no CPU carries more than one rank more than another. ``none`` leaves the ranks with the
launcher's mask. The default
is ``core`` when the node runs at least two local ranks and has at least as many
usable CPUs as local ranks, ``none`` otherwise (as Open MPI's ``mpirun``, which binds
to cores unless the node is oversubscribed).

Why: two ranks that wait for each other by yielding, then sleeping on a futex,
are runnable one at a time; the kernel's load balancer then sees no imbalance and
can leave both on one core, where every hand-over is a context switch
(docs/performance.md, "Bimodal rounds"). Ranks on disjoint CPUs cannot settle there. With more ranks than CPUs the kernel can likewise
leave three of four ranks on one of two CPUs, or all four on one, for whole rounds
(docs/performance.md, "Rounds with more ranks than cores"); ``core:overload-allowed`` fixes
an even share.

The launcher resolves the choice (``plan``); each rank's bootstrap applies it
(``NDIST_BIND_CPUS``) before the program's first line, so every thread the rank
starts inherits it.
"""

from __future__ import annotations

import os

__all__ = ["BIND_TO", "OVERLOAD", "BIND_TO_ENV", "BIND_CPU_ENV", "usable_cpus", "spread_order", "physical_cores", "plan",
           "cpu_text"]

#: the values of ``--bind-to`` (and ``core:N``, N whole cores per rank)
BIND_TO = ("core", "none")
#: ``--bind-to core:overload-allowed``: one CPU per rank even with more ranks than CPUs
OVERLOAD = "core:overload-allowed"
#: what each rank is told: the launcher's choice (``core`` or ``none``) ...
BIND_TO_ENV = "NDIST_BIND_TO"
#: ... and, when bound, its CPUs as a comma-separated list (the bootstrap binds the rank to them)
BIND_CPU_ENV = "NDIST_BIND_CPUS"

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


def physical_cores(cpus: list[int], core_of=_core_of) -> list[list[int]]:
    """``cpus`` grouped by physical core (a core's hardware threads together), the cores in
    the order of their first CPU. ``core_of`` as for ``spread_order``."""
    cores: dict = {}
    for cpu in cpus:
        key = core_of(cpu)
        cores.setdefault(("cpu", cpu) if key is None else key, []).append(cpu)
    return list(cores.values())


def cpu_text(cpus) -> str:
    """``cpus`` as the comma-separated list ``NDIST_BIND_CPUS`` carries."""
    return ",".join(map(str, cpus))


def _per_rank(bind_to: str) -> int | None:
    """N of ``core:N``; None for plain ``core`` (and ``core:overload-allowed``). Raises
    ``ValueError`` naming the option."""
    if bind_to in ("core", OVERLOAD):
        return None
    n = bind_to[len("core:"):]
    if bind_to.startswith("core:") and n.isdigit() and int(n) >= 1:
        return int(n)
    raise ValueError(f"--bind-to: expected 'core', 'core:N' (N >= 1 whole cores per rank), '{OVERLOAD}' or "
                     f"'none', got {bind_to!r}")


def plan(bind_to: str | None, nproc: int, cpus: list[int] | None = None,
         core_of=_core_of) -> tuple[str, tuple[tuple[int, ...], ...]]:
    """``(choice, CPUs of each local rank)`` for ``--bind-to bind_to`` (None: the default) and
    ``nproc`` local ranks over ``cpus`` (default: this process's mask). The tuple is empty
    for ``none``. Raises ``ValueError`` naming the option for a bad value, for ``core`` with
    more local ranks than usable CPUs, or for ``core:N`` with fewer than N cores per rank.
    ``core:overload-allowed`` is ``core`` where every rank has a CPU of its own, and one CPU
    each, dealt round-robin (``spread_order``), where there are more ranks than CPUs."""
    cpus = usable_cpus() if cpus is None else cpus
    if bind_to is None:
        bind_to = "core" if 2 <= nproc <= len(cpus) else "none"
    if bind_to == "none":
        return "none", ()
    per = _per_rank(bind_to)
    cores = physical_cores(cpus, core_of)
    shown = cpu_text(cpus)
    if per is not None:
        if nproc * per > len(cores):
            raise ValueError(f"--bind-to {bind_to}: needs {per} core(s) for each of the {nproc} local ranks "
                             f"(--nproc-per-node {nproc}), but the launcher may run on {len(cores)} core(s) "
                             f"(CPUs {shown}); use --bind-to core, --bind-to none, or fewer ranks")
    elif nproc > len(cpus) and bind_to == OVERLOAD:  # ranks share CPUs, evenly
        order = spread_order(cpus, core_of)
        return "core", tuple((order[r % len(order)],) for r in range(nproc))
    elif nproc > len(cpus):
        raise ValueError(f"--bind-to core: needs a CPU for each of the {nproc} local ranks (--nproc-per-node "
                         f"{nproc}), but the launcher may run on {len(cpus)} CPU(s) ({shown}); use --bind-to none, "
                         f"--bind-to {OVERLOAD} (ranks share CPUs evenly), or fewer ranks")
    elif len(cores) < nproc:  # more ranks than cores: a hardware thread each, first threads first
        order = spread_order(cpus, core_of)
        return "core", tuple((cpu,) for cpu in order[:nproc])
    else:
        per = len(cores) // nproc
    return "core", tuple(tuple(sorted(cpu for core in cores[r * per:(r + 1) * per] for cpu in core))
                         for r in range(nproc))
