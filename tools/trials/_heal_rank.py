"""One rank of a heal trial (``kill_trials.py --heal-trials``): examples/elastic_training.py,
timed, with an optional second loss around the grow.

    ndistrun ... tools/trials/_heal_rank.py <examples/elastic_training.py's arguments>

It records, in ``$HEAL_TRIAL_OUT`` (one small JSON file per record, ``<what>-<slot>-<replacement>``):

* ``boot``: a replacement's times: its process start (from /proc, 10 ms ticks), its first
  line of Python (this file's first statement), its imports done, its ``init_process_group``
  returned (admitted);
* ``lost``: the victim's time just before it SIGKILLs itself (the example's self-kill);
* ``healed``: every member's time when its first collective on a regrown group returned
  (the survivors: after a ``grow_group`` that admitted ranks; a newcomer: after it was
  admitted), one entry per grow;
* ``lost2``: the second victim's time just before the harness's timer kills it.

A second loss (``$HEAL_SECOND``): ``survivor:<slot>:<delay>``: that survivor SIGKILLs itself
``delay`` s after it enters a ``grow_group`` while a newcomer is queued (the decision, the
rebuild or the ready wait); ``newcomer:<delay>``: the victim's first replacement SIGKILLs
itself ``delay`` s after it queued itself to join. Not a test of the example: a harness.
"""

import time

T_PY = time.time()  # (first: the interpreter is up)

import faulthandler  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import elastic_training as example  # noqa: E402
import ndist.distributed as dist  # noqa: E402
import ndist.runtime._world as world  # noqa: E402
from ndist.runtime._heal import read_queue  # noqa: E402

T_IMPORTED = time.time()
OUT = Path(os.environ["HEAL_TRIAL_OUT"]) if os.environ.get("HEAL_TRIAL_OUT") else None
SLOT, REPL = int(os.environ.get("RANK", "0")), int(os.environ.get("NDIST_REPLACEMENT", "0"))
_real_kill = os.kill
_state = {"grown": False}


def put(what: str, value) -> None:
    if OUT is None:
        return
    name = f"{what}-{SLOT}-{REPL}"
    (OUT / (name + ".tmp")).write_text(json.dumps(value))
    os.replace(OUT / (name + ".tmp"), OUT / name)


def process_start() -> float:
    """This process's start (wall clock) from /proc: boot time + start ticks."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def die(what: str) -> None:
    put(what, time.time())
    sys.stdout.flush()
    _real_kill(os.getpid(), signal.SIGKILL)


def kill(pid, sig):  # the example's self-kill: record when
    if pid == os.getpid() and sig == signal.SIGKILL:
        put("lost", time.time())
    _real_kill(pid, sig)


healed: list[float] = []


def first_collective(fn):
    def wrapped(*args, **kwargs):
        out = fn(*args, **kwargs)
        if _state["grown"]:
            _state["grown"] = False
            healed.append(time.time())
            put("healed", healed)
        return out
    return wrapped


def second_loss() -> None:
    spec = os.environ.get("HEAL_SECOND", "")
    if spec.startswith("survivor:"):
        _, slot, delay = spec.split(":")
        if int(slot) != SLOT or REPL != 0:
            return
        grow = dist.grow_group
        armed = [True]

        def grow_group(*args, **kwargs):
            if armed[0] and world._world.heal is not None and len(read_queue(world._world.heal)) > world._world.admitted:
                armed[0] = False
                threading.Timer(float(delay), die, ("lost2",)).start()
            return grow(*args, **kwargs)
        dist.grow_group = grow_group
    elif spec.startswith("newcomer:"):
        if REPL != 1 or os.environ.get("NDIST_REPLACES") is None:
            return
        delay = float(spec.split(":")[1])
        register = world.register

        def registered(*args, **kwargs):
            token = register(*args, **kwargs)
            threading.Timer(delay, die, ("lost2",)).start()
            return token
        world.register = registered


def main() -> int:
    faulthandler.register(signal.SIGUSR1)  # (a hung trial: the harness dumps every rank's stacks)
    os.kill = kill
    second_loss()
    grow = dist.grow_group

    def grow_group(*args, **kwargs):
        out = grow(*args, **kwargs)
        if out:
            _state["grown"] = True
        return out
    dist.grow_group = grow_group
    dist.all_reduce = first_collective(dist.all_reduce)
    dist.broadcast_object_list = first_collective(dist.broadcast_object_list)
    init = dist.init_process_group

    def init_process_group(*args, **kwargs):
        init(*args, **kwargs)
        if dist.joined_running_job():
            put("boot", {"start": process_start(), "python": T_PY, "imported": T_IMPORTED, "admitted": time.time()})
            _state["grown"] = True
    dist.init_process_group = init_process_group
    return example.main(sys.argv[1:])


if __name__ == "__main__":
    if sys.argv[1:] == ["--startup-only"]:  # the interpreter and the imports alone (the harness times this)
        sys.exit(0)
    sys.exit(main())
