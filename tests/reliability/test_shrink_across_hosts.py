"""A rank lost across hosts: the survivors on both "hosts" shrink and finish (issue 29).

Two network namespaces joined by a veth pair are two hosts (``ndist.testing.make_hosts``); one
``ndistrun --nnodes 2 --on-failure continue`` per namespace runs examples/elastic_training.py
on 2 x 2 ranks. One rank SIGKILLs itself at a step; the survivors, on both hosts, catch
``DistRankFailureError``, agree through the job's store on the other host, shrink to 3 ranks
and finish with the weights of the single-process replay (the example checks it and prints
OK). Both launchers exit 0 (``--min-nproc 3``), and the node that lost the rank says so.

Needs root, iproute2 and CAP_NET_ADMIN; skips otherwise (installs nothing)."""

import re
from pathlib import Path

import pytest

from ndist.testing import launch_nodes, make_hosts, ndist_env, outputs, wait_launchers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elastic_training.py"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kill_rank,kill_step", [(3, 5), (1, 5), (2, 0)],
                         ids=["other-host-mid-run", "store-host-mid-run", "other-host-first-step"])
def test_survivors_on_both_hosts_shrink_and_match_the_replay(tmp_path, kill_rank, kill_step):
    with make_hosts(2, pytest.skip) as hosts:
        procs = launch_nodes(hosts, 2, [str(EXAMPLE), "--kill-rank", str(kill_rank), "--kill-step", str(kill_step)],
                             ndist_env(), tmp_path,
                             extra=("--rdzv-timeout", "30", "--term-timeout", "5",
                                    "--on-failure", "continue", "--min-nproc", "3"))
        codes = wait_launchers(procs, 180)
        outs = outputs(tmp_path, 2)
    text = "\n".join(o + e for o, e in outs)
    assert codes == [0, 0], (codes, [e[-3000:] for _, e in outs])
    survivors = [r for r in range(4) if r != kill_rank]
    for r in survivors:
        assert f"[rank{r}]:OK: survivors finished with the weights of the single-process replay" in text, text[-6000:]
        # the loss is named on both hosts: by the member watch (died) or the op that found it (lost)
        assert re.search(rf"\[rank{r}\]:step {kill_step}: lost ranks \[{kill_rank}\] \((died|lost)\) of 4; "
                         "shrinking", text), text[-6000:]
    steps = f"steps per world size: {{4: {kill_step}, 3: {40 - kill_step}}}" if kill_step else \
        "steps per world size: {3: 40}"
    assert text.count(steps) == 3, text[-6000:]
    # the launcher of the rank's node lists it; the job went on without it
    node_err = outs[kill_rank // 2][1]
    assert "finished without 1 lost rank (--on-failure continue)" in node_err, node_err[-3000:]
    assert "killed by SIGKILL" in node_err, node_err[-3000:]
