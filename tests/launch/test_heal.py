"""A heal under ndistrun --on-failure replace: a rank dies, the survivors shrink, the launcher
starts a replacement, and the survivors' grow_group admits it (runtime/_grow.py, _heal.py).

Real processes under a real ndistrun (one node, or two agents with --nnodes 2), each with a
hard timeout; no fixed port (two nodes: a port found free just before). The program (JOB) runs
STEPS all_reduces; the victim SIGKILLs itself at step KILL_STEP; the survivors shrink, then
every member of the default group (survivors, and newcomers once admitted) repeats: grow_group
while the world is short, then an all_reduce of a one-hot vector of the members' rank slots
(RANK), until it sums to all ones: every slot is held again, by a survivor or its replacement.
A loss (an op or the grow) is shrunk, and the heal goes on."""

import os
import re

import pytest

pytestmark = pytest.mark.timeout(120)

JOB = r"""
import os, signal, socket, sys, threading, time
import numpy as np
import ndist.distributed as dist
from ndist.runtime.store import TCPStore

WORLD, STEPS = int(os.environ["WORLD_SIZE"]), 8
victim, kill_step = int(os.environ["VICTIM"]), int(os.environ["KILL_STEP"])
slot, replacement = int(os.environ["RANK"]), int(os.environ.get("NDIST_REPLACEMENT", "0"))
newcomer_dies = os.environ.get("NEWCOMER_DIES") == "1"
dies_in_grow = int(os.environ.get("DIES_IN_GROW", "-1"))  # this slot's first process dies in the first grow


def queue():
    # the heal's queue of newcomers (runtime/_heal.py): this test reads it to time a death
    host, port = os.environ["NDIST_STORE"].rsplit(":", 1)
    store = TCPStore(host, int(port), is_master=False, secret=os.environ["NDIST_SECRET"])
    key = f"ndist/{os.environ['NDIST_RESTART_COUNT']}/0/heal/queue"
    return lambda: store.get(key).decode() if store.check([key]) else ""


if newcomer_dies and replacement == 1:  # die once queued, before any grow admits it
    def die_once_queued(read=queue(), me=f"{socket.gethostname()}-{os.getpid()}-"):
        while me not in read():
            time.sleep(0.002)
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=die_once_queued, daemon=True).start()

dist.init_process_group()
joined = dist.joined_running_job()
print(f"slot {slot} replacement {replacement} init: rank {dist.get_rank()} of {dist.get_world_size()}, "
      f"joined {joined}", flush=True)
if not joined:
    for step in range(STEPS):
        if slot == victim and replacement == 0 and step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(np.ones(4))
        except dist.DistRankFailureError as err:
            print(f"slot {slot}: step {step}: lost {err.failed_ranks} {err.causes}", flush=True)
            dist.shrink_group()
            break
    if newcomer_dies or dies_in_grow >= 0:  # grow only once the first newcomer is queued
        read = queue()
        while not read():
            time.sleep(0.01)
        time.sleep(0.5)
    if slot == dies_in_grow:  # once the first grow's decision is made: inside grow_group
        def die_in_grow():
            host, port = os.environ["NDIST_STORE"].rsplit(":", 1)
            store = TCPStore(host, int(port), is_master=False, secret=os.environ["NDIST_SECRET"])
            while not store.check([f"ndist/{os.environ['NDIST_RESTART_COUNT']}/0/heal/grow/0/decision"]):
                time.sleep(0.001)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=die_in_grow, daemon=True).start()
sizes = [dist.get_world_size()]
while True:
    try:
        if dist.get_world_size() < WORLD:
            grown = dist.grow_group(timeout=30)
            if not grown:
                time.sleep(0.02)
                continue
            print(f"slot {slot}: admitted {grown}: rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
            sizes.append(dist.get_world_size())
        held = np.zeros(WORLD)
        held[slot] = 1
        dist.all_reduce(held)
        if (held == 1).all():
            break
    except dist.DistRankFailureError as err:
        print(f"slot {slot}: lost {err.failed_ranks} {err.causes} while healing: {err}", flush=True)
        dist.shrink_group()
        sizes.append(dist.get_world_size())
total = np.full(3, float(dist.get_rank()))
dist.all_reduce(total)  # the healed group computes: 0 + 1 + ... + WORLD - 1
assert (total == WORLD * (WORLD - 1) / 2).all(), total
print(f"slot {slot} replacement {replacement} healed: rank {dist.get_rank()} of {dist.get_world_size()}, "
      f"sizes {sizes}", flush=True)
dist.destroy_process_group()
"""


def _env(victim, kill_step=3, **extra):
    return {**os.environ, "VICTIM": str(victim), "KILL_STEP": str(kill_step), **extra}


def _summary(err):
    return err[err.index("=" * 72):]


def test_a_replacement_joins_the_survivors_on_one_node(launcher):
    launcher.script(JOB)
    r = launcher.run("--nproc-per-node", 4, "--on-failure", "replace", "job.py", env=_env(2))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    # the replacement's init_process_group returned once admitted, as the last rank, knowing it joined
    assert "[rank2]:slot 2 replacement 1 init: rank 3 of 4, joined True" in out, out
    for s in (0, 1, 3):
        assert f"[rank{s}]:slot {s}: step 3: lost [2] " in out, out
        assert re.search(rf"\[rank{s}\]:slot {s}: admitted \[3\]: rank {s if s < 2 else 2} of 4", out), out
        assert f"[rank{s}]:slot {s} replacement 0 healed: rank {s if s < 2 else 2} of 4, sizes [3, 4]" in out, out
    assert "[rank2]:slot 2 replacement 1 healed: rank 3 of 4, sizes [4]" in out, out
    s = _summary(r.stderr)
    assert "finished; 1 lost process was replaced (--on-failure replace)" in s
    assert "4 of 4 ranks finished with status 0" in s and "replaced rank 2 (replacement 1 of --max-restarts 3" in s


def test_a_newcomer_lost_during_the_grow_is_named_and_the_survivors_shrink_and_grow_again(launcher):
    launcher.script(JOB)
    r = launcher.run("--nproc-per-node", 4, "--on-failure", "replace", "job.py", env=_env(1, NEWCOMER_DIES="1"))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for s in (0, 2, 3):
        # grow_group raised for the newcomer it had admitted (rank 3 of the grown group), which died
        m = re.search(rf"\[rank{s}\]:slot {s}: lost \[3\] \['died'\] while healing: (.*)", out)
        assert m, out
        assert "grow_group on rank" in m.group(1) and "lost a member during the grow: rank 3" in m.group(1), m.group(1)
        assert re.search(rf"\[rank{s}\]:slot {s} replacement 0 healed: rank \d of 4", out), out
    # the second replacement joined and healed the job
    assert re.search(r"\[rank1\]:slot 1 replacement 2 init: rank \d of \d, joined True", out), out
    assert re.search(r"\[rank1\]:slot 1 replacement 2 healed: rank \d of 4", out), out
    s = _summary(r.stderr)
    assert s.count("replaced rank 1 (replacement ") == 2, s


def test_a_survivor_lost_in_the_grow_is_named_and_both_slots_are_healed(launcher):
    # slot 2 dies mid-run; once its replacement is queued, slot 0's first process dies inside the
    # first grow (right after its decision): the others name it and shrink, its node replaces it
    # too, and a later grow admits the second newcomer: every slot is held again
    launcher.script(JOB)
    r = launcher.run("--nproc-per-node", 4, "--on-failure", "replace", "job.py", env=_env(2, DIES_IN_GROW="0"))
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for s in (1, 3):
        # rank 0 (the dead survivor) named, by the grow, or by the grown group's first op if it had said ready
        assert re.search(rf"\[rank{s}\]:slot {s}: lost \[0\] \['died'\] while healing", out), out
        assert re.search(rf"\[rank{s}\]:slot {s} replacement 0 healed: rank \d of 4", out), out
    for s in (0, 2):
        assert re.search(rf"\[rank{s}\]:slot {s} replacement 1 healed: rank \d of 4", out), out
    summary = _summary(r.stderr)
    assert "replaced rank 0 (replacement 1" in summary and "replaced rank 2 (replacement 1" in summary, summary


def test_a_replacement_joins_across_two_nodes(launcher):
    # rank 3 (node 1) dies: node 1's agent starts its replacement; both nodes' survivors admit it
    launcher.script(JOB)
    procs = launcher.nodes("--nproc-per-node", 2, "--on-failure", "replace", env=_env(3))
    outs = launcher.communicate(procs, timeout=100)
    assert [p.returncode for p in procs] == [0, 0], outs
    text = "".join(o for o, _ in outs)
    assert "[rank3]:slot 3 replacement 1 init: rank 3 of 4, joined True" in outs[1][0], outs
    for s in (0, 1, 2):
        assert f"[rank{s}]:slot {s} replacement 0 healed: rank {s} of 4, sizes [3, 4]" in text, outs
    assert "[rank3]:slot 3 replacement 1 healed: rank 3 of 4, sizes [4]" in text, outs
    for _, err in outs:  # every node's summary lists the replacement (published in the store)
        assert "replaced rank 3 (replacement 1 of --max-restarts 3" in _summary(err), err
    assert "starting a replacement" in outs[1][1] and "starting a replacement" not in outs[0][1], outs


NO_GROW = r"""
import os, signal, time
import ndist.distributed as dist
dist.init_process_group()
if dist.get_rank() == 1 and "NDIST_REPLACES" not in os.environ:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(1.5)  # the survivors never call grow_group, and end
print("done", flush=True)
"""


def test_a_newcomer_nobody_admits_fails_once_the_job_has_ended_and_is_not_replaced_again(launcher):
    launcher.script(NO_GROW)
    r = launcher.run("--nproc-per-node", 3, "--on-failure", "replace", "job.py", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    s = _summary(r.stderr)
    assert "DistNetworkError: init_process_group (joining a running job): every process of the job has ended, " \
           "and none admitted this one" in s, s
    assert "lost rank 1 (the job continued without it; replaced 1 time(s) already, --max-restarts 3):" in s, s
    assert "rank 1 is not replaced: no other rank of the job runs any more" in r.stderr
