"""The flight recorder in the format of torch's own dumps, for torch's analyzer.

torch writes a rank's flight recorder to ``$TORCH_FR_DUMP_TEMP_FILE<rank>`` (a
pickle of plain Python types) and reads a folder of them with
``python -m torch.distributed.flight_recorder.fr_trace <folder>``, which
matches every collective across ranks and reports the first one that some rank
never joined or joined with other sizes, dtypes or op. With
``NDIST_FR_DUMP=<prefix>`` ndist writes the same file, ``<prefix><global
rank>``, whenever the flight recorder is dumped (``_debug.dump_all``: an
operation timed out, lost a peer or failed a mismatch check), so a hang or a
desync in an ndist (or ``ndist.torch``) job is analyzed with the tool a torch
user knows.

The layout is torch 2.13's, version ``"2.10"`` (``FlightRecorder.cpp``): keys
``version``, ``comm_lib_version``, ``pg_config`` (``{name: {name, desc,
ranks}}``), ``pg_status`` and ``entries``, one dict per operation, oldest
first. Written without torch (``import ndist`` never imports it); what ndist's
ring does not keep is filled as torch fills it when it does not know:

* ``profiling_name`` is ``"<lib>:<op>"`` with torch's op names; the analyzer
  accepts only torch's backend names as ``<lib>``, so CPU operations say
  ``gloo`` and CUDA ones ``nccl`` (``comm_lib_version`` says ``ndist <version>``);
* sizes are element counts (``[[n]]``), not shapes: the ring keeps counts;
* ``state`` is ``completed`` or ``started`` (issued, or failed: it never
  completed, as a timed-out NCCL op stays ``started``); ``frames`` is empty;
* ``record_id`` numbers the operations of all groups in issue order, counting
  those already pushed out of the rings (exact while at most one group's ring
  has overflowed; the analyzer uses it only to drop what not every rank kept).
"""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any, Iterable

__all__ = ["VERSION", "torch_dump", "write_torch_dump"]

log = logging.getLogger("ndist.collectives.debug")

VERSION = "2.10"  # the dump layout torch 2.13 writes and its analyzer reads

#: ndist's op -> the name torch records (``components/types.py``'s COLLECTIVES and P2P)
_TORCH_OP = {
    "all_reduce": "all_reduce", "reduce": "reduce", "broadcast": "broadcast", "barrier": "barrier",
    "all_gather": "all_gather", "all_gather_into": "_all_gather_base", "gather": "gather", "scatter": "scatter",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_from": "_reduce_scatter_base",
    # uneven splits make the inputs differ per rank: torch names both forms all_to_all,
    # which the analyzer matches by total size across ranks
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "send": "send", "recv": "recv",
}
#: NumPy's dtype names -> torch's ScalarType names, as torch writes them
_TORCH_DTYPE = {
    "float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16", "int64": "Long",
    "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte", "bool": "Bool",
    "complex64": "ComplexFloat", "complex128": "ComplexDouble", "uint16": "UInt16", "uint32": "UInt32",
    "uint64": "UInt64",
}


def _entry_dict(e: list, record_id: int, pg_id: int, pg_name: str, desc: str, group_rank: int,
                timeout_ms: int | None) -> dict:
    seq, op, device, dtype, count_in, count_out, root, t_issued, t_done, error = e
    op = str(op)
    p2p = op in ("send", "recv")
    name = _TORCH_OP.get(op, op)
    if p2p:  # torch's "send 0->1" / "recv 1<-0", in group ranks (-1: recv from any source)
        peer = -1 if root is None else int(root)
        name = f"send {group_rank}->{peer}" if op == "send" else f"recv {group_rank}<-{peer}"
    lib = "nccl" if str(device) == "cuda" else "gloo"
    dt = [] if dtype is None else [_TORCH_DTYPE.get(str(dtype), str(dtype))]
    completed = t_done is not None and error is None
    created = int(t_issued * 1e9)
    return {
        "record_id": record_id, "pg_id": pg_id, "process_group": (pg_name, desc),
        "thread_name": "", "thread_id": "",
        "collective_seq_id": 0 if p2p else seq, "p2p_seq_id": seq if p2p else 0, "op_id": seq,
        "profiling_name": f"{lib}:{name}", "time_created_ns": created,
        "input_sizes": [[int(count_in or 0)]], "input_dtypes": dt,
        "output_sizes": [[int(count_out or 0)]], "output_dtypes": dt,
        "state": "completed" if completed else "started",
        "time_discovered_started_ns": created,
        "time_discovered_completed_ns": int(t_done * 1e9) if completed else None,
        "retired": t_done is not None, "timeout_ms": timeout_ms, "is_p2p": p2p, "frames": [],
        "ndist_error": error,  # (ndist's own key: the analyzer reads only the keys above)
    }


def torch_dump(groups: Iterable[tuple[Any, Any]], world: Any = None, version: str = "") -> dict:
    """The dump of one process: ``groups`` are ``(process group, FlightRecorder)`` pairs,
    ``world`` the default group (torch's ``default_pg``)."""
    rows: list[tuple[float, dict]] = []
    pg_config: dict = {}
    pg_status: dict = {}
    dropped = 0
    for pg_id, (pg, rec) in enumerate(groups):
        ring = rec.ring.copy()  # (one C call, atomic under the GIL)
        dropped += rec.issued() - len(ring)
        devices = {str(e[2]) for e in ring}
        ranks = list(getattr(pg, "ranks", ()))
        desc = getattr(pg, "group_desc", "") or ("default_pg" if pg is world else "undefined")
        me = ranks.index(rec.global_rank) if rec.global_rank in ranks else -1
        timeout = getattr(pg, "timeout", None)
        timeout_ms = None if timeout is None else int(timeout.total_seconds() * 1000)
        for device in sorted(devices) or [""]:
            # one group used with CPU and CUDA tensors numbers each apart: two torch groups
            name = rec.group_name if len(devices) <= 1 else f"{rec.group_name}:{device}"
            pg_config[name] = {"name": name, "desc": desc, "ranks": str(ranks)}
            mine = [e for e in ring if str(e[2]) == device or not device]
            colls = [e for e in mine if str(e[1]) not in ("send", "recv")]
            pg_status[name] = {
                "last_enqueued_collective": max((e[0] for e in colls), default=-1),
                "last_started_collective": max((e[0] for e in colls), default=-1),
                "last_completed_collective": max((e[0] for e in colls if e[8] is not None and e[9] is None),
                                                 default=-1),
            }
            for e in mine:
                rows.append((e[7], _entry_dict(e, 0, pg_id, name, desc, me, timeout_ms)))
    rows.sort(key=lambda r: r[0])
    entries = []
    for i, (_, d) in enumerate(rows):
        d["record_id"] = dropped + i
        entries.append(d)
    return {"version": VERSION, "comm_lib_version": f"ndist {version}".strip(), "pg_config": pg_config,
            "pg_status": pg_status, "entries": entries}


def write_torch_dump(prefix: str, rank: int, dump: dict) -> str | None:
    """Write ``dump`` to ``<prefix><rank>`` (atomically); the path, or None when it could not."""
    path = f"{prefix}{rank}"
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(tmp, "wb") as f:
            pickle.dump(dump, f)
        os.replace(tmp, path)
    except OSError as err:
        log.error("cannot write the flight recorder (torch's format) to %s: %s", path, err)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    return path
