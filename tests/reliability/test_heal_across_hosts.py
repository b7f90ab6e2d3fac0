"""A heal across hosts: a rank is lost on either of two "hosts", its host's launcher starts the
replacement, and the survivors on both hosts admit it (issue 44).

Two network namespaces joined by a veth pair are two hosts (``ndist.testing.make_hosts``); one
``ndistrun --nnodes 2 --on-failure replace`` per namespace runs examples/elastic_training.py
--heal on 2 x 2 ranks. One rank SIGKILLs itself at a step; the survivors on both hosts shrink to
3, the victim's node starts its replacement, the survivors' grow_group admits it (its member
watch dials across the link), rank 0 sends it the state, and every rank finishes at 4 ranks
with the weights of the single-process replay (the example checks it and prints OK).

Needs root, iproute2 and CAP_NET_ADMIN; skips otherwise (installs nothing)."""

import re
from pathlib import Path

import pytest

from ndist.testing import launch_nodes, make_hosts, ndist_env, outputs, wait_launchers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_training.py"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kill_rank", [3, 1], ids=["other-host", "store-host"])
def test_the_victims_host_replaces_it_and_both_hosts_admit_it(tmp_path, kill_rank):
    with make_hosts(2, pytest.skip) as hosts:
        procs = launch_nodes(hosts, 2, [str(EXAMPLE), "--kill-rank", str(kill_rank), "--kill-step", "5", "--heal"],
                             ndist_env(), tmp_path,
                             extra=("--rdzv-timeout", "30", "--term-timeout", "5", "--on-failure", "replace"))
        codes = wait_launchers(procs, 180)
        outs = outputs(tmp_path, 2)
    text = "\n".join(o + e for o, e in outs)
    assert codes == [0, 0], (codes, [e[-3000:] for _, e in outs])
    for r in range(4):
        assert f"[rank{r}]:world sizes: 4 -> 3 -> 4" in text, text[-6000:]
        assert f"[rank{r}]:OK: every rank finished with the weights of the single-process replay" in text, text[-6000:]
    assert re.search(rf"\[rank{kill_rank}\]:joined the running job as rank 3 of 4 at step \d+ "
                     rf"\(replacing rank {kill_rank}\)", text), text[-6000:]
    node = kill_rank // 2
    assert "starting a replacement (1 of --max-restarts 3)" in outs[node][1], outs[node][1][-3000:]
    assert "starting a replacement" not in outs[1 - node][1], outs[1 - node][1][-3000:]
    for _, err in outs:  # every node's summary lists it
        assert f"replaced rank {kill_rank} (replacement 1 of --max-restarts 3" in err, err[-3000:]
