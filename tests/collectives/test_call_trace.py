"""The files one collective call runs code in are the lists docs/architecture.md
gives ("The files a call runs code in"): at most 8 on the socket backend's default
engine and 6 on MPI (issue #13)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.collectives import trace_cases
from tests.collectives.collective_launch import launch, unavailable

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
LIMIT = {"socket, native engine": 8, "mpi": 6}
#: the ops whose repeated call is one C call on the native engine (the public function's file alone)
ONE_CALL = ("all_reduce", "all_to_all_single even", "all_to_all_single uneven", "all_gather_into_tensor")
CASES = [("socket, native engine", "socket", {"NDIST_ENGINE": "native"}),
         ("socket, Python engine", "socket", {"NDIST_ENGINE": "python"}),
         ("mpi", "mpi", {"NDIST_ENGINE": "auto"})]  # (auto: the C bookkeeping, whatever the outer run forces)


def _documented() -> dict:
    lists = {}
    for m in re.finditer(r"^- (socket, native engine, one C call|socket, native engine|socket, Python engine|mpi) "
                         r"\((\d+)\): (.+)$",
                         DOC.read_text(), re.M):
        files = re.findall(r"`([^`]+)`", m.group(3))
        assert len(files) == int(m.group(2)), f"{m.group(1)}: the count says {m.group(2)}, the list has {len(files)}"
        lists[m.group(1)] = files
    return lists


def _native_built() -> bool:
    from ndist.collectives.backends.socket.native import _engine as _native

    return _native._load() is not None


def _crun_built() -> bool:
    try:
        from ndist.collectives import _crun  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.timeout(200)
@pytest.mark.parametrize("label,backend,env", CASES, ids=["socket-native", "socket-python", "mpi-backend"])
def test_a_call_crosses_the_documented_files(label, backend, env):
    reason = unavailable(backend, 2)
    if reason:
        pytest.skip(reason)
    if env.get("NDIST_ENGINE") == "native" and not _native_built():
        pytest.skip("the native engine is not built here")
    documented = _documented()
    assert label in documented, f"docs/architecture.md lists no files for {label!r}"
    want = documented[label]
    if label == "mpi" and not _crun_built():  # the bookkeeping's Python twin (docs/architecture.md)
        want = want + ["collectives/_common.py"]
    for rank, result in enumerate(launch(backend, trace_cases, 2, 150, env=env)):
        engine = result.pop("engine")
        if backend == "socket":
            assert engine == env["NDIST_ENGINE"], (rank, engine)
        union: list[str] = []
        for op, paths in result.items():
            for path in paths["first"] + paths["repeated"]:
                if path not in union:
                    union.append(path)
        assert sorted(union) == sorted(want), (f"rank {rank}: {label} calls run code in {union}; "
                                               f"docs/architecture.md lists {want}")
        if label in LIMIT:
            assert len(union) <= LIMIT[label], union
        if label == "socket, native engine":
            one = documented["socket, native engine, one C call"]
            for op in ONE_CALL:
                assert result[op]["repeated"] == one, (rank, op, result[op]["repeated"])
