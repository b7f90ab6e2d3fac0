"""grow_group's argument checks, its one-round cost with nobody waiting, and its refusal of a
group that lost a member (shrink first). Real ranks (ndist.testing.run_ranks: its store stands
for the launcher's). The heal itself, with replacements under ndistrun: tests/launch/test_heal.py."""

import math
import os
import signal
import time
from datetime import timedelta

import numpy as np
import pytest

import ndist.distributed as dist
from ndist.runtime._world import _world
from ndist.testing import run_ranks

pytestmark = pytest.mark.timeout(90)

BAD = [
    ("5", TypeError, "timeout: expected datetime.timedelta, seconds (int or float) or None, got str '5'"),
    (True, TypeError, "timeout: expected datetime.timedelta, seconds (int or float) or None, got bool True"),
    (-1, ValueError, "timeout: expected a positive, finite duration, got -1"),
    (0, ValueError, "timeout: expected a positive, finite duration, got 0"),
    (math.nan, ValueError, "timeout: expected a positive, finite duration, got nan"),
    (timedelta(seconds=-2), ValueError, "timeout: expected a positive, finite duration, got "
                                        "datetime.timedelta(days=-1, seconds=86398)"),
]


def _bad_then_nobody_waits(rank, ws):
    said = []
    for value, kind, _ in BAD:
        try:
            dist.grow_group(timeout=value)
        except kind as err:
            said.append(str(err))
    sent = _world.heal.check(["grow/0/decision"])  # (nothing was sent for the bad calls)
    t = np.full(3, float(rank))
    dist.all_reduce(t)  # the group is usable
    grown = [dist.grow_group(timeout=5), dist.grow_group(), dist.grow_group(timedelta(seconds=3))]
    decided = [_world.heal.check([f"grow/{g}/decision"]) for g in range(3)]
    t2 = np.full(3, 1.0)
    dist.all_reduce(t2)
    return said, sent, t.tolist(), grown, decided, t2.tolist(), dist.get_world_size(), dist.joined_running_job()


def test_bad_timeout_is_refused_before_anything_is_sent_and_nobody_waiting_returns_empty():
    for said, sent, t, grown, decided, t2, size, joined in run_ranks(_bad_then_nobody_waits, 3):
        assert said == [msg for _, _, msg in BAD]
        assert sent is False and t == [3.0] * 3
        assert grown == [[], [], []] and decided == [True] * 3  # one decision per call: its one round
        assert t2 == [3.0] * 3 and size == 3 and joined is False


def _grow_a_revoked_group(rank, ws):
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while dist.get_failed_ranks() != [2]:  # the member watch tells the loss
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        dist.grow_group()
    except dist.DistRankFailureError as err:
        refused = (type(err).__name__, err.failed_ranks, str(err))
    dist.shrink_group()
    grown = dist.grow_group()
    t = np.ones(2)
    dist.all_reduce(t)
    return refused, grown, t.tolist()


def test_a_group_that_lost_a_member_is_refused_until_it_is_shrunk():
    out = run_ranks(_grow_a_revoked_group, 3, may_die=[2])
    for refused, grown, t in out[:2]:
        kind, failed, text = refused
        assert kind == "DistRankFailureError" and failed == [2], refused
        assert "rank 2" in text, text
        assert grown == [] and t == [2.0, 2.0]


def test_grow_group_before_init_is_refused():
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.grow_group()
    assert dist.joined_running_job() is False
