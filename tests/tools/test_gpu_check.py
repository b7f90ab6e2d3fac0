"""tools/gpu_check.sh on a machine without a GPU, and its Python helper.

On a CPU-only machine the script must say so in one line, exit 0 and leave nothing
behind. Forced to run anyway (``NDIST_GPU_CHECK_FORCE=1``) its parts run for real and
fail, as they must without a GPU: that checks the machinery (timeouts, the report, the
merged JUnit XML, the exit status) that the device run relies on.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "gpu_check.sh"
HELPER = ROOT / "tools" / "gpu_check_helper.py"
NO_GPU_LINE = "gpu_check: no NVIDIA GPU on this machine (nvidia-smi lists none, no /dev/nvidia*): nothing checked"


def _has_gpu() -> bool:
    if glob.glob("/dev/nvidia[0-9]*"):
        return True
    if shutil.which("nvidia-smi") is None:
        return False
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    return any(line.startswith("GPU ") for line in out.splitlines())


needs_no_gpu = pytest.mark.skipif(_has_gpu(), reason="this machine has a GPU: the script would run the device checks")
needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and GNU timeout")


def _processes_with(token: str) -> list[int]:
    """Live processes whose environment carries ``token`` (what the script started and left)."""
    mark = f"GPU_CHECK_TEST_TOKEN={token}".encode()
    pids = []
    for env in glob.glob("/proc/[0-9]*/environ"):
        try:
            with open(env, "rb") as f:
                if mark in f.read().split(b"\0"):
                    pids.append(int(env.split("/")[2]))
        except OSError:
            continue
    return pids


def _run(tmp_path, args, extra_env, timeout):
    token = os.urandom(8).hex()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NDIST_GPU_CHECK") and k != "OUT"}
    env.update(TMPDIR=str(tmp), PYTHON=sys.executable, GPU_CHECK_TEST_TOKEN=token)
    env.update(extra_env)
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=timeout)
    return proc, tmp, token


@needs_bash
@needs_no_gpu
@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["argument", "OUT"])
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0_leaving_nothing(tmp_path, how):
    out = tmp_path / "out"
    args, env = ([str(out)], {}) if how == "argument" else ([], {"OUT": str(out)})
    proc, tmp, token = _run(tmp_path, args, env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [NO_GPU_LINE]
    assert proc.stderr == ""
    assert not out.exists()
    assert list(tmp.iterdir()) == []
    assert _processes_with(token) == []


@needs_bash
@needs_no_gpu
@pytest.mark.timeout(60)
def test_without_a_gpu_it_exits_0_even_without_an_output_folder(tmp_path):
    proc, tmp, _ = _run(tmp_path, [], {}, timeout=30)
    assert (proc.returncode, proc.stdout.splitlines()) == (0, [NO_GPU_LINE])
    assert list(tmp.iterdir()) == []


@needs_bash
@pytest.mark.timeout(60)
@pytest.mark.parametrize("env, message", [
    ({"NDIST_GPU_CHECK_PARTS": "seed,nosuch"}, "unknown part 'nosuch'"),
    ({"NDIST_GPU_CHECK_TIMEOUTS": "seed"}, "bad entry 'seed' in NDIST_GPU_CHECK_TIMEOUTS"),
    ({"NDIST_GPU_CHECK_TIMEOUTS": "nosuch=3"}, "bad entry 'nosuch=3'"),
    ({"NDIST_GPU_CHECK_TIMEOUTS": "seed=soon"}, "bad entry 'seed=soon'"),
    ({"NDIST_GPU_CHECK_BUDGET": "6m"}, "NDIST_GPU_CHECK_BUDGET: expected whole seconds; got '6m'"),
])
def test_bad_settings_are_usage_errors(tmp_path, env, message):
    proc, tmp, _ = _run(tmp_path, [str(tmp_path / "out")], {"NDIST_GPU_CHECK_FORCE": "1", **env}, timeout=30)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert list(tmp.iterdir()) == [] and not (tmp_path / "out").exists()


# The parts a forced run on a CPU machine goes through, and what each must report there.
FORCED = {
    "versions": "FAIL",       # no CuPy (or no usable one): MISSING ...
    "seed": "FAIL",           # every test skipped: no GPU
    "suite": "FAIL",          # the GPU modules skip (test_gpu_setup.py passes)
    "mpi": "FAIL",            # skipped: needs CuPy and a CUDA GPU
    "staging": "FAIL",        # the module skips: no CuPy
    "example": "FAIL",        # the example says "skipped: no CUDA GPU ..."
    "nccl_bench": "FAIL",     # "skipped: ..." instead of "# PASS"
    "graph_bench": "FAIL",    # "skipped: ..." instead of "# PASS"
    "staging_bench": "FAIL",  # "skipped: ..." instead of "# OK"
    "ipc": "TIMEOUT",         # given 0.2 s: too short for pytest to finish
}
# The parts whose pytest ran to its end and wrote JUnit XML on any machine.
FORCED_XML = ["seed", "suite", "mpi", "staging"]


@needs_bash
@needs_no_gpu
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_forced_run_without_a_gpu_reports_every_part_and_fails(tmp_path):
    out = tmp_path / "out"
    # ample time for every part but ipc, so that a loaded machine cannot turn a FAIL into a TIMEOUT
    limits = ",".join(f"{p}={0.2 if p == 'ipc' else 120}" for p in FORCED)
    env = {"NDIST_GPU_CHECK_FORCE": "1", "NDIST_GPU_CHECK_PARTS": " ".join(FORCED),
           "NDIST_GPU_CHECK_TIMEOUTS": limits, "NDIST_GPU_CHECK_BUDGET": "340"}
    proc, tmp, token = _run(tmp_path, [str(out)], env, timeout=360)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = (out / "report.md").read_text()
    assert proc.stdout.startswith("# ndist GPU check")  # the report, also on stdout
    rows = [line.split("|")[1:-1] for line in report.splitlines() if line.startswith("| ") and "---" not in line]
    table = {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}
    assert list(table) == list(FORCED)
    for part, status in FORCED.items():
        result, seconds, limit, note = table[part]
        assert result == status, (part, table[part])
        assert float(seconds) >= 0
    assert table["ipc"][2] == "0.2"
    assert "MISSING" in report and "## Versions" in report
    assert all("skipped:" in table[p][3] for p in ("nccl_bench", "graph_bench", "staging_bench"))
    for part in FORCED_XML:  # collected, and skipped for want of a GPU
        assert "unexpected skip(s)" in table[part][3], table[part]
    # what comes back from the device tool: few files, no folder
    assert sorted(p.name for p in out.iterdir()) == ["junit.xml", "logs.tar.gz", "report.md"]
    suites = ET.parse(out / "junit.xml").getroot()
    assert suites.tag == "testsuites"
    names = [s.get("name") for s in suites.iter("testsuite")]
    # ipc's SIGINT comes at 0.2 s. On a slow machine pytest has not started and writes nothing;
    # on a fast one it has, takes the SIGINT as a KeyboardInterrupt and still writes its XML,
    # which is what the SIGINT is for. Either way it comes last, in the order the parts ran.
    assert names in (FORCED_XML, FORCED_XML + ["ipc"]), names
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {f"{p}.log" for p in FORCED} <= names and "seed.xml" in names
    assert list(tmp.iterdir()) == []  # its work folder is gone
    assert _processes_with(token) == []


@needs_bash
def test_the_script_parses():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt install shellcheck)")
def test_shellcheck_finds_nothing():
    proc = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def _run_with_python(tmp_path, name: str, wrapper_text: str, parts: str):
    """The script forced to run ``parts`` with ``PYTHON`` a bash wrapper (``wrapper_text``,
    after its ``#!``) named ``name``: ``(proc, tmp, token, out, wrapper)``."""
    wrapper = tmp_path / name
    wrapper.write_text(f"#!/bin/bash\n{wrapper_text}")
    wrapper.chmod(0o755)
    out = tmp_path / "out"
    proc, tmp, token = _run(tmp_path, [str(out)], {"NDIST_GPU_CHECK_FORCE": "1", "NDIST_GPU_CHECK_PARTS": parts,
                                                   "PYTHON": str(wrapper)}, timeout=100)
    return proc, tmp, token, out, wrapper


@needs_bash
@needs_no_gpu
@pytest.mark.timeout(120)
def test_a_process_a_part_leaves_running_is_killed_and_reported(tmp_path):
    # an interpreter that leaves a sleeper behind, in the part's process group, before it runs
    proc, tmp, token, out, _ = _run_with_python(
        tmp_path, "python-leaving-a-process", f"(sleep 300 >/dev/null 2>&1 &)\nexec {sys.executable} \"$@\"\n",
        "nccl_bench")
    assert proc.returncode == 1
    row = next(line for line in (out / "report.md").read_text().splitlines() if line.startswith("| nccl_bench "))
    assert "skipped:" in row and "left 1 process(es) running (killed)" in row
    assert _processes_with(token) == []
    assert list(tmp.iterdir()) == []


@needs_bash
@needs_no_gpu
@pytest.mark.timeout(120)
def test_a_missing_pytest_is_reported_as_such(tmp_path):
    # -S: no site-packages, so this interpreter has no pytest
    proc, tmp, _, out, wrapper = _run_with_python(tmp_path, "python-without-pytest",
                                                  f"exec {sys.executable} -S \"$@\"\n", "seed,ipc")
    assert proc.returncode == 1
    rows = [line for line in (out / "report.md").read_text().splitlines() if line.startswith(("| seed ", "| ipc "))]
    assert len(rows) == 2
    for row in rows:
        assert "| FAIL | 0 |" in row and f"pytest is not installed for {wrapper}" in row
    assert list(tmp.iterdir()) == []


def test_every_file_the_script_runs_exists():
    text = SCRIPT.read_text()
    paths = set(re.findall(r"\b((?:tests|examples|benchmarks|tools)/[\w/]+\.py)\b", text))
    assert {"tests/gpu/test_cuda_semantics_seed.py", "tests/gpu/test_staging_cupy.py", "tests/gpu/test_mp_cuda.py",
            "tests/gpu/test_mpi_cupy.py", "examples/gpu_all_reduce.py", "benchmarks/nccl_overhead.py",
            "benchmarks/nccl_graph.py", "benchmarks/staging_overhead.py", "tools/gpu_check_helper.py"} <= paths
    assert [p for p in sorted(paths) if not (ROOT / p).is_file()] == []
    # the suite part is tests/gpu without the files the other parts run
    ignored = set(re.findall(r"--ignore=(tests/gpu/\w+\.py)", text))
    assert ignored == {"tests/gpu/test_cuda_semantics_seed.py", "tests/gpu/test_staging_cupy.py",
                       "tests/gpu/test_mp_cuda.py", "tests/gpu/test_mpi_cupy.py"}


# ------------------------------------------------------------------ the helper

def _helper():
    spec = importlib.util.spec_from_file_location("gpu_check_helper", HELPER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _junit(path, cases):
    """A pytest-shaped JUnit file: ``cases`` is a list of ``None`` (passed), ``("skip", reason)``,
    ``("fail", message)``."""
    suite = ET.Element("testsuite", name="part", tests=str(len(cases)), errors="0",
                       failures=str(sum(1 for c in cases if c and c[0] == "fail")),
                       skipped=str(sum(1 for c in cases if c and c[0] == "skip")))
    for i, case in enumerate(cases):
        tc = ET.SubElement(suite, "testcase", classname="tests.gpu.mod", name=f"test_{i}")
        if case and case[0] == "skip":
            ET.SubElement(tc, "skipped", type="pytest.skip", message="collection skipped").text = case[1]
        elif case:
            ET.SubElement(tc, "failure", message=case[1])
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return str(path)


def test_verdict_passes_with_only_the_skips_one_gpu_explains(tmp_path):
    h = _helper()
    xml = _junit(tmp_path / "a.xml", [None, None, ("skip", "needs 2 CUDA device(s), found 1"),
                                      ("skip", "needs 3 GPUs"), ("skip", "mpiexec not found")])
    assert h.verdict(xml, 0) == ("PASS", "2 passed, 0 failed, 0 errors, 3 skipped (2 for more GPUs, 1 for no mpiexec)")


def test_verdict_fails_on_a_skip_that_means_the_gpu_code_did_not_run(tmp_path):
    h = _helper()
    # a module-level skip, as pytest writes it: message "collection skipped", the reason in the text
    nccl = "('/r/tests/gpu/_gpu.py', 70, \"Skipped: NCCL is not installed: cupy.cuda.nccl.available is False\")"
    xml = _junit(tmp_path / "a.xml", [None, ("skip", nccl), ("skip", nccl), ("skip", "needs 2 GPUs")])
    assert h.verdict(xml, 0) == ("FAIL", "1 passed, 0 failed, 0 errors, 3 skipped (1 for more GPUs); unexpected "
                                         "skip(s): NCCL is not installed: cupy.cuda.nccl.available is False (x2)")


def test_verdict_fails_on_failures_a_bad_exit_or_nothing_passed(tmp_path):
    h = _helper()
    assert h.verdict(_junit(tmp_path / "a.xml", [None, ("fail", "boom")]), 1) == (
        "FAIL", "exit 1: 1 passed, 1 failed, 0 errors, 0 skipped")
    assert h.verdict(_junit(tmp_path / "c.xml", []), 5)[0] == "FAIL"
    assert h.verdict(_junit(tmp_path / "d.xml", []), 0)[0] == "FAIL"


def test_verdict_is_skip_when_every_test_skipped_for_a_reason_one_gpu_explains(tmp_path):
    h = _helper()
    assert h.verdict(_junit(tmp_path / "a.xml", [("skip", "mpiexec not found")]), 0) == (
        "SKIP", "0 passed, 0 failed, 0 errors, 1 skipped (1 for no mpiexec)")
    assert h.verdict(_junit(tmp_path / "b.xml", [("skip", "mpiexec not found"), ("skip", "no CUDA device")]), 0)[0] \
        == "FAIL"


def test_verdict_without_xml_is_a_failure_line(tmp_path):
    proc = subprocess.run([sys.executable, str(HELPER), "verdict", str(tmp_path / "none.xml"), "124"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stdout.startswith("FAIL\texit 124: no JUnit XML")


def test_merge_keeps_every_suite_and_skips_a_broken_file(tmp_path):
    h = _helper()
    a = _junit(tmp_path / "a.xml", [None])
    b = _junit(tmp_path / "b.xml", [None, ("skip", "needs 2 GPUs")])
    (tmp_path / "broken.xml").write_text("<testsuites><testsuite")
    h.merge(str(tmp_path / "all.xml"), [a, str(tmp_path / "broken.xml"), b])
    root = ET.parse(tmp_path / "all.xml").getroot()
    assert [len(list(s.iter("testcase"))) for s in root.iter("testsuite")] == [1, 2]
    assert h.count(str(tmp_path / "all.xml")) == "2 passed, 0 failed, 0 errors, 1 skipped"


@needs_bash
@needs_no_gpu
@pytest.mark.timeout(120)
def test_the_report_names_the_commit_and_the_tracked_files_changed_since_it(tmp_path):
    """The device tool runs a copy of a working tree, which may carry changes not committed
    (or git metadata older than its files): the report's checkout says so."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "tools")
    shutil.copy(HELPER, repo / "tools")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "add", "-A"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-qm", "x"], check=True, timeout=30)
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          timeout=30).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NDIST_GPU_CHECK") and k != "OUT"}
    env.update(NDIST_GPU_CHECK_FORCE="1", NDIST_GPU_CHECK_PARTS="versions", PYTHON=sys.executable)
    for changed, want in ((False, f"checkout {head}, "), (True, f"checkout {head} + 1 tracked file(s) changed since it")):
        if changed:
            with open(repo / "tools" / "gpu_check_helper.py", "a") as f:
                f.write("\n# changed\n")
        out = tmp_path / f"out{int(changed)}"
        subprocess.run(["bash", str(repo / "tools" / "gpu_check.sh"), str(out)], capture_output=True, text=True,
                       env=env, timeout=100)
        assert want in (out / "report.md").read_text(), (out / "report.md").read_text()[:400]
