"""Entry point of one rank started by ``ndist.testing.run_ranks``.

Reads the function from the store the parent hosts (``NDIST_TESTING_STORE``), runs
it between ``init_process_group`` and ``destroy_process_group``, and writes
the outcome (value, or error text + traceback + the pickled exception) back.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback


def _watch_parent(parent: int) -> None:
    """If run_ranks' process dies (killed, no cleanup), take this rank's whole
    process group down with it instead of leaving orphans behind."""
    while os.getppid() == parent:
        time.sleep(0.5)
    try:
        os.killpg(0, signal.SIGKILL)
    finally:
        os._exit(1)


def _under_torch(fn, rank, world_size, args, backend, timeout):
    """``fn`` between torch's ``init_process_group(backend)`` (env://, on torchrun's store)
    and ``destroy_process_group()``, as a torchrun user's script runs."""
    from datetime import timedelta

    import torch.distributed as tdist

    import ndist.torch  # noqa: F401 - registers backend "ndist"

    tdist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    try:
        return fn(rank, world_size, *args)
    finally:
        tdist.destroy_process_group()


def main() -> int:
    from . import _run
    from ..distributed import destroy_process_group, init_process_group, is_initialized  # registers backends
    from ..runtime import _env
    from ..runtime.store import TCPStore

    import cloudpickle

    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="ndist-parent-watch", daemon=True).start()
    job = _env.detect()  # RANK and WORLD_SIZE (spawn, ndistrun, torchrun), or an MPI launcher's
    rank, world_size = job.rank, job.world_size
    host, _, port = os.environ[_run.STORE_VAR].rpartition(":")
    store = TCPStore(host, int(port), timeout=60, secret=os.environ[_run.SECRET_VAR])
    prefix = _run.PREFIX
    for p in reversed(json.loads(store.get(prefix + "sys_path"))):
        if p not in sys.path:
            sys.path.insert(0, p)

    def report(outcome) -> None:
        try:
            data = cloudpickle.dumps(outcome)
        except Exception as err:  # noqa: BLE001 - e.g. an unpicklable return value
            data = cloudpickle.dumps(("error", f"rank {rank}'s outcome could not be pickled: {err!r}", "", None))
        store.set(f"{prefix}result/{rank}", data)
        n = store.add(prefix + "count", 1)
        store.set(f"{prefix}event/{n}", str(rank))

    def failure(err: BaseException):
        try:
            exc = cloudpickle.dumps(err)
            cloudpickle.loads(exc)
        except Exception:  # noqa: BLE001 - send the text only
            exc = None
        return ("error", f"{type(err).__name__}: {err}", traceback.format_exc(), exc)

    try:
        fn, args, init, backend, timeout, launcher = cloudpickle.loads(store.get(prefix + "payload"))
        if init and launcher == "torchrun":
            value = _under_torch(fn, rank, world_size, args, backend, timeout)
        else:
            if init:
                init_process_group(backend=backend, timeout=timeout)
            value = fn(rank, world_size, *args)
            if init and is_initialized():
                destroy_process_group()
        outcome = ("ok", value)
    except BaseException as err:  # noqa: BLE001 - every failure goes back to the parent
        report(failure(err))
        try:
            if is_initialized():
                destroy_process_group()
        finally:
            store.close()
        return 1
    report(outcome)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
