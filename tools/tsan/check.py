"""ThreadSanitizer over the C interface's GIL-free path (docs/native.md, "Thread safety").

Builds the native extension with ``-fsanitize=thread`` in place (the sanitizer build's switch,
``NDIST_NATIVE_CFLAGS`` / ``NDIST_NATIVE_LDFLAGS``), runs ``capi_threads_job.py`` on 2 ranks
under ``ndistrun`` with libtsan preloaded (CPython is not built with TSan: only the extension and
the C test library are instrumented; TSan's interceptors still see CPython's locks, the GIL
among them), then builds the extension again without the flags. Exits 1 when TSan reported
anything (the reports are printed) or the job failed, 0 when it is clean, and 0 with a line
saying so where the compiler has no libtsan (nothing run).

    python tools/tsan/check.py [--calls N] [--no-build] [--keep]

``--no-build``: the extension is TSan-built already. ``--keep``: leave it TSan-built (to run
pytest under the same preload afterwards, docs/native.md says how).
"""

from __future__ import annotations

import argparse
import glob
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
CFLAGS = "-O1 -g -fsanitize=thread -fno-omit-frame-pointer"
LDFLAGS = "-fsanitize=thread"


def libtsan(cc: str) -> str | None:
    """The compiler's libtsan.so, or None where it has none."""
    try:
        path = subprocess.run([cc, "-print-file-name=libtsan.so"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return path if os.path.isabs(path) and os.path.exists(path) else None


def build(sanitized: bool) -> None:
    env = dict(os.environ)
    for k in ("NDIST_NATIVE_CFLAGS", "NDIST_NATIVE_LDFLAGS"):
        env.pop(k, None)
    if sanitized:
        env.update(NDIST_NATIVE_CFLAGS=CFLAGS, NDIST_NATIVE_LDFLAGS=LDFLAGS)
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace", "--force"], cwd=ROOT, env=env,
                   check=True, capture_output=True, text=True)
    # (the build is optional: a failure only warns, so look at what was built)
    so = glob.glob(str(ROOT / "ndist/collectives/backends/socket/native/_cnative*.so"))
    if not so:
        raise SystemExit("tools/tsan/check.py: the native extension was not built")
    syms = subprocess.run(["nm", "-D", so[0]], capture_output=True, text=True).stdout
    if ("__tsan_init" in syms) != sanitized:
        raise SystemExit(f"tools/tsan/check.py: {so[0]} is {'not ' if sanitized else ''}TSan-built")


def run_job(lib: str, calls: int, logs: pathlib.Path) -> int:
    # (no suppressions: CPython is not instrumented, so its own accesses are never reported)
    opts = [f"log_path={logs}/tsan", "exitcode=0", "history_size=4"]
    env = dict(os.environ, LD_PRELOAD=lib, TSAN_OPTIONS=" ".join(opts), NDIST_ENGINE="native",
               NDIST_TEST_CAPI_CFLAGS="-g -fsanitize=thread",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, "-m", "ndist.launch", "--nproc-per-node", "2", "--no-python", sys.executable,
           str(ROOT / "tests/collectives/backends/capi_threads_job.py"), str(calls)]
    return subprocess.run(cmd, cwd=ROOT, env=env, timeout=600).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300, help="calls per C thread (default 300)")
    ap.add_argument("--no-build", action="store_true", help="the extension is TSan-built already")
    ap.add_argument("--keep", action="store_true", help="leave the extension TSan-built")
    args = ap.parse_args()
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    lib = libtsan(cc) if cc else None
    if lib is None:
        print("tools/tsan/check.py: skipped: the C compiler has no libtsan.so")
        return 0
    if not args.no_build:
        build(True)
    try:
        with tempfile.TemporaryDirectory(prefix="ndist-tsan-") as tmp:
            rc = run_job(lib, args.calls, pathlib.Path(tmp))
            reports = []
            for f in sorted(glob.glob(f"{tmp}/tsan*")):
                text = pathlib.Path(f).read_text(errors="replace")
                if "WARNING: ThreadSanitizer" in text:
                    reports.append(text)
            for text in reports:
                print(text)
    finally:
        if not args.keep:
            build(False)
    print(f"tools/tsan/check.py: job exit status {rc}, {len(reports)} process(es) with TSan reports")
    return 1 if rc or reports else 0


if __name__ == "__main__":
    sys.exit(main())
