"""``ndistrun --bind-to core|core:overload-allowed|none``: each local rank on a CPU of its own, from the launcher's mask."""

import json
import os
import secrets

import pytest

from ndist.launch._binding import plan, spread_order

pytestmark = pytest.mark.timeout(90)

CPUS = sorted(os.sched_getaffinity(0))
needs_2_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")

# Each rank records its affinity, a thread's (threads inherit the binding) and what the launcher told it.
RECORD = """
import json, os, threading
seen = {}
t = threading.Thread(target=lambda: seen.update(thread=sorted(os.sched_getaffinity(0))))
t.start(); t.join()
with open(os.path.join(os.environ.get("AFF_DIR", "."), f"aff-{os.environ['RANK']}.json"), "w") as f:
    json.dump({"cpus": sorted(os.sched_getaffinity(0)), "thread": seen["thread"],
               "bind_to": os.environ.get("NDIST_BIND_TO"), "cpu": os.environ.get("NDIST_BIND_CPUS")}, f)
"""


def _seen(launcher, ranks):
    return [json.load(open(os.path.join(launcher.cwd, f"aff-{r}.json"))) for r in range(ranks)]


def _on(cpus):
    """``preexec_fn`` that starts the launcher with affinity mask ``cpus``."""
    return lambda: os.sched_setaffinity(0, cpus)


@needs_2_cpus
def test_default_binds_each_rank_to_a_cpu_of_its_own(launcher):
    launcher.script(RECORD)
    r = launcher.run("--nproc-per-node", 2, "job.py")
    assert r.returncode == 0, r.stderr
    seen = _seen(launcher, 2)
    chosen = plan(None, 2)[1]  # (this process's mask is the launcher's)
    assert not set(chosen[0]) & set(chosen[1]) and set(chosen[0]) | set(chosen[1]) <= set(CPUS)
    assert [s["cpus"] for s in seen] == [list(chosen[0]), list(chosen[1])]
    for s in seen:
        assert s["thread"] == s["cpus"] and s["bind_to"] == "core" and s["cpu"] == ",".join(map(str, s["cpus"]))


@needs_2_cpus
def test_binding_stays_inside_the_launchers_mask(launcher):
    """A launcher started on the last CPU only: 'core' binds its one rank there (not CPU 0); two
    ranks on that one CPU are left as they are (the default is 'none' when ranks > CPUs)."""
    last = CPUS[-1]
    launcher.script(RECORD)
    r = launcher.run("--nproc-per-node", 1, "--bind-to", "core", "job.py", preexec_fn=_on({last}))
    assert r.returncode == 0, r.stderr
    assert _seen(launcher, 1)[0]["cpus"] == [last]
    r = launcher.run("--nproc-per-node", 2, "job.py", preexec_fn=_on({last}))
    assert r.returncode == 0, r.stderr
    for s in _seen(launcher, 2):
        assert s["cpus"] == [last] and s["bind_to"] == "none" and s["cpu"] is None


@needs_2_cpus
def test_none_leaves_the_ranks_unbound(launcher):
    launcher.script(RECORD)
    r = launcher.run("--nproc-per-node", 2, "--bind_to", "none", "job.py")
    assert r.returncode == 0, r.stderr
    for s in _seen(launcher, 2):
        assert s["cpus"] == CPUS and s["thread"] == CPUS and s["bind_to"] == "none" and s["cpu"] is None


def test_one_rank_is_not_bound_by_default(launcher):
    launcher.script(RECORD)
    r = launcher.run("--nproc-per-node", 1, "job.py")
    assert r.returncode == 0, r.stderr
    assert _seen(launcher, 1)[0] == {"cpus": CPUS, "thread": CPUS, "bind_to": "none", "cpu": None}


@pytest.mark.parametrize("args, words", [
    (["--nproc-per-node", 2, "--bind-to", "socket"],
     ["--bind-to", "'core', 'core:N'", "'core:overload-allowed'", "'none'", "'socket'"]),
    (["--nproc-per-node", 2, "--bind-to", "core:0"], ["--bind-to", "'core:N' (N >= 1", "'core:0'"]),
    (["--nproc-per-node", 2, "--bind-to", "core:%d" % len(CPUS)],
     [f"--bind-to core:{len(CPUS)}", "2 local ranks", "core(s)"]),
    (["--nproc-per-node", len(CPUS) + 1, "--bind-to", "core"],
     ["--bind-to core", f"{len(CPUS) + 1} local ranks", f"{len(CPUS)} CPU(s)", "--bind-to none",
      "--bind-to core:overload-allowed"]),
])
def test_bad_values_stop_the_launcher_before_any_rank(launcher, args, words):
    launcher.script(RECORD)
    r = launcher.run(*args, "job.py")
    assert r.returncode == 2, r.stderr
    for w in words:
        assert w in r.stderr
    assert not [f for f in os.listdir(launcher.cwd) if f.startswith("aff-")]


@needs_2_cpus
def test_overload_allowed_shares_the_cpus_evenly(launcher):
    """More ranks than CPUs: 'core:overload-allowed' binds each rank to one CPU, round-robin, so no
    CPU carries two ranks more than another (plain 'core' refuses, the default leaves them unbound)."""
    n = len(CPUS) + 1
    launcher.script(RECORD)
    r = launcher.run("--nproc-per-node", n, "--bind-to", "core:overload-allowed", "job.py")
    assert r.returncode == 0, r.stderr
    seen = _seen(launcher, n)
    assert all(len(s["cpus"]) == 1 and s["thread"] == s["cpus"] and s["bind_to"] == "core" for s in seen), seen
    load = [sum(s["cpus"] == [c] for s in seen) for c in CPUS]
    assert sum(load) == n and max(load) - min(load) <= 1, load


@needs_2_cpus
def test_every_node_binds_its_own_ranks(launcher):
    launcher.script(RECORD)
    n0, n1 = launcher.nodes("--nproc-per-node", 2, each=((), ("--bind-to", "none")), first=1)
    (_, err0), (_, err1) = launcher.communicate([n0, n1])
    assert n0.returncode == 0 and n1.returncode == 0, (err0, err1)
    seen = _seen(launcher, 4)
    assert [s["bind_to"] for s in seen] == ["core", "core", "none", "none"]
    assert all(len(s["cpus"]) == 1 for s in seen[:2]) and seen[0]["cpus"] != seen[1]["cpus"]
    assert seen[2]["cpus"] == seen[3]["cpus"] == CPUS


def test_plan_spreads_over_physical_cores_first():
    # CPUs 0-3 are the first threads of cores 0-3, 4-7 their siblings (a common SMT numbering)
    core_of = {c: (0, c % 4) for c in range(8)}.get
    assert spread_order(list(range(8)), core_of) == list(range(8))
    # siblings numbered next to each other: 0,1 on core 0; 2,3 on core 1; ...
    pairs = {c: (0, c // 2) for c in range(8)}.get
    assert spread_order(list(range(8)), pairs) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert spread_order([5, 7], lambda c: None) == [5, 7]  # no topology: every CPU a core of its own
    assert plan(None, 2, [3, 9]) == ("core", ((3,), (9,)))
    assert plan(None, 1, [3, 9]) == ("none", ())
    assert plan(None, 3, [3, 9]) == ("none", ())
    assert plan("none", 2, [3, 9]) == ("none", ())
    with pytest.raises(ValueError, match=r"--bind-to core: .* 3 local ranks .* 2 CPU\(s\) \(3,9\).*core:overload-allowed"):
        plan("core", 3, [3, 9])
    # overload allowed: a CPU each, round-robin over the spread order; as plain core when ranks fit
    assert plan("core:overload-allowed", 5, [3, 9]) == ("core", ((3,), (9,), (3,), (9,), (3,)))
    pairs = {c: (0, c // 2) for c in range(4)}.get  # 0,1 one core; 2,3 another
    assert plan("core:overload-allowed", 6, [0, 1, 2, 3], pairs) == ("core", ((0,), (2,), (1,), (3,), (0,), (2,)))
    assert plan("core:overload-allowed", 2, [3, 9]) == plan("core", 2, [3, 9])


def test_plan_gives_each_rank_an_equal_share_of_whole_cores():
    """A rank's own threads (OpenMP, torch's pool) keep every core of its share: 8 cores, 4 ranks,
    2 whole cores each, a core's hardware threads together; core:N asks for N cores each."""
    smt = {c: (0, c % 8) for c in range(16)}.get  # CPUs 0-7 the first threads of cores 0-7, 8-15 their siblings
    assert plan(None, 4, list(range(16)), smt) == (
        "core", ((0, 1, 8, 9), (2, 3, 10, 11), (4, 5, 12, 13), (6, 7, 14, 15)))
    assert plan(None, 3, list(range(8)), lambda c: None) == ("core", ((0, 1), (2, 3), (4, 5)))  # CPU 6, 7 idle
    assert plan("core:1", 4, list(range(16)), smt) == ("core", ((0, 8), (1, 9), (2, 10), (3, 11)))
    # more ranks than cores, as many CPUs: a hardware thread each, one of every core first
    assert plan(None, 3, [0, 1, 2, 3], {0: (0, 0), 1: (0, 0), 2: (0, 1), 3: (0, 1)}.get) == (
        "core", ((0,), (2,), (1,)))
    with pytest.raises(ValueError, match=r"--bind-to core:3: needs 3 core\(s\) for each of the 4 local ranks .* 8 core"):
        plan("core:3", 4, list(range(16)), smt)
    for bad in ("core:", "core:x", "core:-1", "cores", "core:overload"):
        with pytest.raises(ValueError, match=r"--bind-to: expected 'core', 'core:N'"):
            plan(bad, 2, [0, 1])


@needs_2_cpus
@pytest.mark.timeout(180)
def test_hosts_in_namespaces_never_bind_two_hosts_to_one_cpu(tmp_path):
    """ndist.testing's namespace "hosts" share this machine's CPUs: with a CPU per rank each host's
    launcher gets CPUs of its own (2 x 1: the two ranks on different CPUs); with more ranks than
    CPUs nothing is bound (every rank keeps the whole mask)."""
    from ndist.testing import launch_nodes, make_hosts, ndist_env, outputs, wait_launchers

    job = tmp_path / "job.py"
    job.write_text(RECORD)
    cases = [(1, 2), (len(CPUS), 2)]  # (ranks per host, hosts): one CPU each; twice as many ranks as CPUs
    with make_hosts(2, pytest.skip) as hosts:
        for per_host, n_hosts in cases:
            folder = tmp_path / f"{per_host}x{n_hosts}"
            folder.mkdir()
            env = ndist_env(NDIST_SECRET=secrets.token_hex(32), AFF_DIR=str(folder))
            procs = launch_nodes(hosts, per_host, [str(job)], env, folder)
            codes = wait_launchers(procs, 90)
            assert codes == [0, 0], [e[-2000:] for _, e in outputs(folder, 2)]
            seen = [json.load(open(folder / f"aff-{r}.json")) for r in range(per_host * n_hosts)]
            if per_host == 1:
                assert [len(s["cpus"]) for s in seen] == [1, 1] and seen[0]["cpus"] != seen[1]["cpus"], seen
            else:
                assert all(s["cpus"] == CPUS and s["bind_to"] == "none" for s in seen), seen
