"""``torch.distributed.shrink_group`` on backend "ndist" keeps a member that a connection
failure made other survivors record as lost, when it is alive and calls ``shrink_group``
too: the torch-side agreement counts as lost only what the torch job's member watch saw go
(``ndist/torch/_watch.py``), never a member a backend merely lost a connection to, as
ndist's own ``shrink_group`` does (the torch twin of
tests/reliability/test_shrink_keeps_suspected.py).

Four ranks over TCP, the test hosts the store (``ndist://``): rank 0 resets its collective
link to rank 1 (a connection failing by itself, as a middlebox's reset would), rank 1's next
collective finds it closed and records rank 0 lost, then rank 3 dies. Every survivor calls
``shrink_group`` with ``[3]``, or with ``ndist.torch.get_failed_ranks()`` (the recipe in
docs/torch.md), which must not name rank 0 on rank 1, and must end in one group of three."""

import signal
import sys
import textwrap

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.timeout(180)]

_JOB = """
import os, signal, socket, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ndist.torch
from ndist.torch import _watch
from ndist.torch._compiled import python_group  # (the Python group under either backend)

torch.set_num_threads(1)
dist.init_process_group("ndist", init_method="ndist://", timeout=timedelta(seconds=30))
me = dist.get_rank()
store = dist.distributed_c10d._get_default_store()
nd = python_group(dist.distributed_c10d._get_default_group()).ndist_group
out = torch.empty(4)
dist.all_to_all_single(out, torch.arange(4.0))  # every pair linked
if me == 0:
    nd.backend_for("cpu")._eng.conns[1].sock.shutdown(socket.SHUT_RDWR)
    store.set("suspect/reset", "1")
if me == 1:
    store.wait(["suspect/reset"])
if me == 3:
    store.wait(["suspect/suspected"])
    os.kill(os.getpid(), signal.SIGKILL)
try:
    dist.all_reduce(torch.ones(4))
    got = "none"
except Exception as err:
    got = f"{type(err.__cause__).__name__}:{getattr(err, 'failed_ranks', None)}".replace(" ", "")
if me == 1:
    store.set("suspect/suspected", "1")
deadline = time.monotonic() + 30
while 3 not in _watch._job.lost:  # (the watch saw rank 3 go)
    assert time.monotonic() < deadline, "rank 3's loss was never told"
    time.sleep(0.01)
asked = [3] if sys.argv[1] == "3" else ndist.torch.get_failed_ranks()
print(f"error {got} recorded {nd.failed_ranks()} asked {asked}".replace(", ", ","), flush=True)
try:
    dist.shrink_group(asked)
except ValueError as err:
    print(f"refused: {err}", flush=True)
    raise SystemExit(3)
y = torch.full((4,), float(me + 1))
dist.all_reduce(y)
print(f"result {dist.get_world_size()} {dist.get_rank()} {y[0].item():g}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.parametrize("asked", ["3", "get_failed_ranks"])
@pytest.mark.parametrize("engine", ["native", "python"])
def test_a_member_suspected_lost_that_calls_torch_shrink_group_is_kept(tmp_path, engine, asked):
    from tests.reliability.rank_loss_jobs import run_job

    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(_JOB))
    # (tcp: a same-host group runs on the native engine otherwise, which has no links to reset)
    ended = run_job(str(script), 4, [asked], env={"NDIST_TRANSPORT": "tcp", "NDIST_ENGINE": engine}, timeout=120)
    assert ended[3].code == -signal.SIGKILL, [e.code for e in ended]
    # rank 1 did take rank 0 for lost; get_failed_ranks names only the rank whose process ended
    assert "error DistRankFailureError:[0] recorded [0,3] asked [3]" in ended[1].out, \
        (ended[1].out + ended[1].err)[-4000:]
    for rank in (0, 1, 2):
        e = ended[rank]
        assert e.code == 0, (e.out + e.err)[-4000:]
        assert f"result 3 {rank} 6" in e.out, (e.out + e.err)[-4000:]
