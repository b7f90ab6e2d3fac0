"""The Python half of tools/gpu_check.sh (standard library only; CuPy only for ``versions``).

    python tools/gpu_check_helper.py versions             versions of the GPU stack; exit 1 if a need is missing
    python tools/gpu_check_helper.py count RESULT.xml     "P passed, F failed, E errors, S skipped" of a JUnit XML
    python tools/gpu_check_helper.py verdict RESULT.xml RC    "PASS|SKIP|FAIL<TAB>note" of a pytest part
    python tools/gpu_check_helper.py merge OUT.xml IN.xml...   one <testsuites> document of several
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import platform
import re
import sys
import xml.etree.ElementTree as ET

DISTRIBUTIONS = ("numpy", "cloudpickle", "pytest", "pytest-timeout", "mpi4py", "torch", "cupy-cuda13x",
                 "nvidia-nccl-cu13")
NEEDED_MODULES = ("numpy", "cloudpickle", "pytest", "cupy")

# Skips that one GPU explains (tests/gpu needs 2 or 3 devices for these) and skips for a tool
# the device image may lack (mpiexec, torch with CUDA): a pytest part with only these passes.
# Any other skip on a GPU machine ("no CUDA device", "NCCL is not installed", no CuPy) means
# the GPU code did not run, and the part fails.
ALLOWED_SKIPS = (
    ("more GPUs", re.compile(r"needs \d+ (CUDA device|GPU)")),
    ("no mpiexec", re.compile(r"mpiexec not found")),
    ("no mpi4py", re.compile(r"could not import 'mpi4py'")),
    ("no CUDA torch", re.compile(r"could not import 'torch'|torch without CUDA")),
)


def _dist_version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def versions() -> int:
    """Print the Python, CUDA, CuPy, NCCL and MPI versions and the GPUs; 1 if something needed is missing."""
    print(f"python {platform.python_version()} ({sys.executable})")
    for name in DISTRIBUTIONS:
        print(f"{name} {_dist_version(name)}")
    missing = [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None]
    try:
        import cupy

        rt = cupy.cuda.runtime
        print(f"cupy {cupy.__version__}: CUDA runtime {rt.runtimeGetVersion()}, "
              f"driver supports CUDA {rt.driverGetVersion()}")
        for i in range(rt.getDeviceCount()):
            p = rt.getDeviceProperties(i)
            print(f"cuda:{i} {p['name'].decode()}, compute capability {p['major']}.{p['minor']}, "
                  f"{p['totalGlobalMem'] / 2**30:.1f} GiB, {p['multiProcessorCount']} SMs")
        from cupy.cuda import nccl

        if getattr(nccl, "available", False):
            print(f"NCCL {nccl.get_version()} (cupy.cuda.nccl)")
        else:
            missing.append("NCCL (cupy.cuda.nccl.available is False)")
    except Exception as err:  # noqa: BLE001 - reported, the run goes on
        print(f"CuPy/CUDA: {type(err).__name__}: {err}")
        if "cupy" not in missing:
            missing.append("a working CuPy")
    try:
        from mpi4py import MPI

        print("MPI library:", MPI.Get_library_version().splitlines()[0])
    except Exception as err:  # noqa: BLE001 - mpi4py is optional for the GPU checks
        print(f"mpi4py: {type(err).__name__}: {err}")
    if missing:
        print("MISSING:", ", ".join(missing))
        return 1
    return 0


def _suites(root: ET.Element) -> list[ET.Element]:
    return [root] if root.tag == "testsuite" else list(root.iter("testsuite"))


def count(path: str) -> str:
    """``"P passed, F failed, E errors, S skipped"`` of one pytest JUnit XML file."""
    total = failed = errors = skipped = 0
    for suite in _suites(ET.parse(path).getroot()):
        total += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0))
        errors += int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    passed = total - failed - errors - skipped
    return f"{passed} passed, {failed} failed, {errors} errors, {skipped} skipped"


def _reason(message: str, text: str) -> str:
    """The reason of one JUnit ``<skipped>``: its message, or for a module-level skip (message
    "collection skipped") the reason inside its text ``('file', line, "Skipped: reason")``."""
    if message and message != "collection skipped":
        return message
    m = re.search(r"Skipped: (.*?)['\"]?\)?\s*$", text, re.S)
    return (m.group(1) if m else text or message or "?").strip()


def _skip_reasons(path: str) -> list[str]:
    reasons = []
    for suite in _suites(ET.parse(path).getroot()):
        for case in suite.iter("testcase"):
            for skip in case.findall("skipped"):
                reasons.append(_reason(skip.get("message") or "", skip.text or ""))
    return reasons


def verdict(path: str, rc: int) -> tuple[str, str]:
    """PASS when pytest exited 0, at least one test passed and every skip is allowed
    (``ALLOWED_SKIPS``); SKIP when none ran and every skip is allowed; else FAIL."""
    counts = count(path)
    passed = int(counts.split()[0])
    allowed: dict[str, int] = {}
    other: list[str] = []
    for reason in _skip_reasons(path):
        label = next((lab for lab, rx in ALLOWED_SKIPS if rx.search(reason)), None)
        if label is None:
            other.append(reason)
        else:
            allowed[label] = allowed.get(label, 0) + 1
    note = counts
    if allowed:
        note += " (" + ", ".join(f"{n} for {lab}" for lab, n in allowed.items()) + ")"
    if other:
        seen = {r: other.count(r) for r in dict.fromkeys(other)}
        listed = " / ".join(r if n == 1 else f"{r} (x{n})" for r, n in seen.items())
        note += f"; unexpected skip(s): {listed[:300]}"
    if rc != 0:
        return "FAIL", f"exit {rc}: {note}"
    if other or (passed == 0 and not allowed):
        return "FAIL", note
    return ("PASS" if passed else "SKIP"), note


def merge(out: str, paths: list[str]) -> None:
    """Write the test suites of ``paths`` as one ``<testsuites>`` document to ``out``."""
    root = ET.Element("testsuites")
    for path in paths:
        try:
            root.extend(_suites(ET.parse(path).getroot()))
        except (ET.ParseError, OSError) as err:
            sys.stderr.write(f"gpu_check_helper: skipping {path}: {err}\n")
    ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["versions"] and len(argv) == 1:
        return versions()
    if argv[:1] == ["count"] and len(argv) == 2:
        print(count(argv[1]))
        return 0
    if argv[:1] == ["verdict"] and len(argv) == 3:
        try:
            status, note = verdict(argv[1], int(argv[2]))
        except (ET.ParseError, OSError) as err:
            status, note = "FAIL", f"exit {argv[2]}: no JUnit XML ({err})"
        print(f"{status}\t{note}")
        return 0
    if argv[:1] == ["merge"] and len(argv) >= 3:
        merge(argv[1], argv[2:])
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
