"""What every rank sees (environment, argv, __main__ semantics) and how its output is forwarded."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)

ENV_DUMP = """
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
        "MASTER_ADDR", "MASTER_PORT", "NDIST_STORE", "NDIST_SECRET", "NDIST_ERROR_FILE", "NDIST_RUN_ID",
        "NDIST_RESTART_COUNT", "NDIST_MAX_RESTARTS", "PYTHONUNBUFFERED"]
out = {k: os.environ.get(k) for k in keys}
out.update(argv=sys.argv, name=__name__, file=__file__, path0=sys.path[0], spec=repr(__spec__),
           main_is_module=sys.modules["__main__"].__dict__ is globals(), pid=os.getpid(),
           leftover=sorted(k for k in globals() if not k.startswith("__")))
tag = os.environ.get("RANK", "plain")
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"env-{tag}.json"), "w") as f:
    json.dump(out, f)
"""


def _load(d, tag):
    with open(os.path.join(d, f"env-{tag}.json")) as f:
        return json.load(f)


def test_rank_environment(launcher):
    launcher.script(ENV_DUMP)
    r = launcher.run("--nproc-per-node", 3, "--rdzv-id", "myjob", "job.py", "--lr", "0.1", "x y")
    assert r.returncode == 0, r.stderr
    envs = [_load(launcher.cwd, str(i)) for i in range(3)]
    for i, e in enumerate(envs):
        assert (e["RANK"], e["LOCAL_RANK"]) == (str(i), str(i))
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "3"
        assert e["GROUP_RANK"] == e["NODE_RANK"] == "0" and e["GROUP_WORLD_SIZE"] == "1"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        store_port = int(e["NDIST_STORE"].rpartition(":")[2])
        assert e["NDIST_STORE"] == f"127.0.0.1:{store_port}" and store_port > 0
        # MASTER_PORT: another port, free for the program's own rank-0 store (torch's env://)
        assert int(e["MASTER_PORT"]) > 0 and int(e["MASTER_PORT"]) != store_port
        assert e["MASTER_PORT"] == envs[0]["MASTER_PORT"] and e["NDIST_STORE"] == envs[0]["NDIST_STORE"]
        assert len(e["NDIST_SECRET"]) == 64 and e["NDIST_SECRET"] == envs[0]["NDIST_SECRET"]
        assert e["NDIST_RUN_ID"] == "myjob"
        assert (e["NDIST_RESTART_COUNT"], e["NDIST_MAX_RESTARTS"]) == ("0", "0")
        assert e["PYTHONUNBUFFERED"] == "1"
        assert e["NDIST_ERROR_FILE"].endswith(os.path.join("attempt_0", str(i), "error.json"))
    assert len({e["NDIST_ERROR_FILE"] for e in envs}) == 3


def test_nproc_per_node_auto_is_the_usable_cpus(launcher):
    launcher.script('import os; print(os.environ["LOCAL_WORLD_SIZE"])')
    r = launcher.run("--nproc-per-node", "auto", "job.py")
    assert r.returncode == 0, r.stderr
    n = len(os.sched_getaffinity(0))
    assert sorted(r.stdout.splitlines()) == sorted(f"[rank{i}]:{n}" for i in range(n))


def test_script_sees_plain_python_semantics(launcher, tmp_path):
    # argv, __name__, __file__, sys.path[0], __spec__, real __main__: as ``python job.py args``.
    launcher.script(ENV_DUMP)
    sub = tmp_path / "sub"
    sub.mkdir()
    plain = subprocess.run([sys.executable, "job.py", "a", "--b"], cwd=launcher.cwd, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert plain.returncode == 0, plain.stderr
    r = launcher.run("--nproc-per-node", 2, "job.py", "a", "--b")
    assert r.returncode == 0, r.stderr
    want = _load(launcher.cwd, "plain")
    for i in range(2):
        got = _load(launcher.cwd, str(i))
        for k in ("argv", "name", "file", "path0", "spec", "main_is_module", "leftover"):
            assert got[k] == want[k], k
        assert got["name"] == "__main__" and got["main_is_module"] is True


def test_module_mode_like_python_m(launcher, tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text(ENV_DUMP)
    plain = subprocess.run([sys.executable, "-m", "mypkg.tool", "q"], cwd=launcher.cwd, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "RANK"})
    assert plain.returncode == 0, plain.stderr
    r = launcher.run("--nproc-per-node", 2, "-m", "mypkg.tool", "q")
    assert r.returncode == 0, r.stderr
    want = json.loads((pkg / "env-plain.json").read_text())
    got = json.loads((pkg / "env-1.json").read_text())
    for k in ("argv", "name", "file", "path0", "main_is_module", "leftover"):
        assert got[k] == want[k], k
    assert got["argv"][0].endswith(os.path.join("mypkg", "tool.py"))


def test_no_python_runs_an_executable(launcher):
    r = launcher.run("--nproc-per-node", 2, "--no-python", "sh", "-c", 'echo "hi $RANK of $WORLD_SIZE"')
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[rank0]:hi 0 of 2", "[rank1]:hi 1 of 2"]


def test_no_python_missing_executable_fails_with_127(launcher):
    r = launcher.run("--nproc-per-node", 2, "--no-python", "surely-not-a-program-ndist")
    assert r.returncode == 127
    assert "cannot run 'surely-not-a-program-ndist'" in r.stderr


def test_output_prefixed_and_streams_kept_apart(launcher):
    launcher.script("""
        import os, sys
        r = os.environ["RANK"]
        for i in range(3):
            print(f"out {r} {i}")
        sys.stderr.write(f"err {r}\\n")
        sys.stdout.write(f"partial {r}")  # no newline: flushed at exit with one added
    """)
    r = launcher.run("--nproc-per-node", 2, "job.py")
    assert r.returncode == 0, r.stderr
    out, err = r.stdout.splitlines(), r.stderr.splitlines()
    for rank in (0, 1):
        assert [l for l in out if l.startswith(f"[rank{rank}]:")] == [
            f"[rank{rank}]:out {rank} 0", f"[rank{rank}]:out {rank} 1", f"[rank{rank}]:out {rank} 2",
            f"[rank{rank}]:partial {rank}",
        ]
        assert f"[rank{rank}]:err {rank}" in err
    assert not any("err" in l for l in out) and not any("out" in l for l in err)
    assert len(out) == 8 and r.stdout.endswith("\n")


def test_prefix_template(launcher):
    launcher.script('import os; print("x")')
    r = launcher.run("--nproc-per-node", 2, "--log-line-prefix-template", "<${local_rank}/${rank}> ", "job.py")
    assert sorted(r.stdout.splitlines()) == ["<0/0> x", "<1/1> x"]
    r = launcher.run("--nproc-per-node", 2, "--log-line-prefix-template", "", "job.py")
    assert r.stdout.splitlines() == ["x", "x"]


def test_local_ranks_filter(launcher):
    launcher.script('import os, sys; print("o", os.environ["RANK"]); print("e", os.environ["RANK"], file=sys.stderr)')
    r = launcher.run("--nproc-per-node", 3, "--local-ranks-filter", "0,2", "job.py")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.splitlines()) == ["[rank0]:o 0", "[rank2]:o 2"]
    assert sorted(l for l in r.stderr.splitlines() if l.startswith("[rank")) == ["[rank0]:e 0", "[rank2]:e 2"]


def test_binary_and_long_lines_pass_through(launcher):
    launcher.script("""
        import sys
        sys.stdout.buffer.write(b"\\xff\\xfe raw\\n")
        sys.stdout.write("y" * 200000 + "\\n")
    """)
    r = subprocess.run(launcher.cmd("--nproc-per-node", 1, "job.py"), cwd=launcher.cwd, capture_output=True, timeout=60)
    assert r.returncode == 0
    assert r.stdout.startswith(b"[rank0]:\xff\xfe raw\n")
    assert r.stdout.count(b"y") == 200000


@pytest.mark.parametrize("module", [False, True])
def test_rank_traceback_is_the_one_plain_python_prints(launcher, tmp_path, module):
    pkg = tmp_path / "pk"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("def inner():\n    raise ValueError('bad value')\n\ninner()\n")
    target = ["-m", "pk.bad"] if module else [os.path.join("pk", "bad.py")]
    plain = subprocess.run([sys.executable, *target], cwd=launcher.cwd, capture_output=True, text=True)
    r = launcher.run("--nproc-per-node", 1, *target)
    assert r.returncode == plain.returncode == 1
    forwarded = [l[len("[rank0]:"):] for l in r.stderr.splitlines() if l.startswith("[rank0]:")]
    assert forwarded == plain.stderr.splitlines()


def test_long_lines_from_concurrent_ranks_never_interleave(launcher):
    # Lines longer than a pipe's atomic write, from 3 ranks at once: each arrives whole.
    launcher.script("""
import os, sys
r = os.environ["RANK"]
for i in range(100):
    sys.stdout.write(r * 20000 + "\\n")
""")
    r = subprocess.run(launcher.cmd("--nproc-per-node", 3, "job.py"), cwd=launcher.cwd, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split(b"\n")
    assert lines[-1] == b"" and len(lines) == 301
    for line in lines[:-1]:
        rank = line[5:6]
        assert line == b"[rank" + rank + b"]:" + rank * 20000
