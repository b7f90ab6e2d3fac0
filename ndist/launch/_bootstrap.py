"""The first code a rank runs: ``python -c "<import this file>; main(...)" script args``.

It makes the rank die with the launcher (``PR_SET_PDEATHSIG``), then runs the
user's program with the semantics of plain ``python script.py args`` /
``python -m module args``: the same ``sys.argv``, ``sys.path[0]``,
``__name__ == "__main__"`` in the real ``__main__`` module, ``__file__``.
An unhandled exception is written to ``$NDIST_ERROR_FILE`` (JSON) before it
propagates, so the launcher can show its traceback in the failure summary;
tracebacks printed to stderr do not show the bootstrap's frames, and frames
inside the ``ndist`` package are folded into one line (``[... 14 frames inside
ndist ...]``) unless ``NDIST_DEBUG`` is INFO, DETAIL or DEBUG; the error file
keeps the full traceback and the short one.

Only the standard library is imported here, and only what is needed: this
runs in every rank before the user's first line. The launcher imports this
file as a top-level module from its directory (then drops it from
``sys.path`` and ``sys.modules``), so the ``ndist`` package is not imported
on the rank's behalf.
"""

# No ``from __future__ import annotations`` here: it imports the __future__
# module at run time, a cost every rank would pay before its first line.
import os
import sys

__all__ = ["main", "write_error_file", "format_exception", "ERROR_FILE_ENV"]

ERROR_FILE_ENV = "NDIST_ERROR_FILE"
_PR_SET_PDEATHSIG = 1
_SIGKILL = 9  # Linux; not signal.SIGKILL: importing signal imports enum, ~1 ms per rank
_THIS = __file__
_DEBUG_LEVELS = ("INFO", "DETAIL", "DEBUG")  # NDIST_DEBUG values that show every frame


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when the launcher (our parent) dies, even by SIGKILL."""
    if not sys.platform.startswith("linux") or parent_pid <= 0:
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no libc / no prctl: best effort only
        return
    # The launcher may have died between fork and prctl: then we were re-parented already.
    if os.getppid() != parent_pid:
        os._exit(128 + _SIGKILL)


def _bind_cpu() -> None:
    """``ndistrun --bind-to core``: bind this rank (and every thread and process it starts) to
    the CPUs the launcher chose for it (``NDIST_BIND_CPUS``, a comma-separated list within the
    launcher's own mask)."""
    cpus = os.environ.get("NDIST_BIND_CPUS")
    if not cpus:
        return
    try:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    except (OSError, ValueError, AttributeError) as err:  # (the mask changed since the launcher read it)
        sys.stderr.write(f"ndistrun: rank not bound to CPUs {cpus!r} (--bind-to core): {err}\n")


def write_error_file(exc: BaseException, path: str | None = None) -> None:
    """Record ``exc`` (type, message, traceback, rank, host, time) as JSON at ``path``.

    ``path`` defaults to ``$NDIST_ERROR_FILE``; nothing happens without one.
    The first error recorded wins: an existing file is left alone.
    """
    path = path or os.environ.get(ERROR_FILE_ENV)
    if not path:
        return
    import json
    import socket
    import time
    import traceback

    tb = _user_tb(exc.__traceback__)
    record = {
        "exc_type": type(exc).__qualname__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, tb)),
        "short_traceback": format_exception(exc, tb, full=False),
        "rank": _int_env("RANK"),
        "local_rank": _int_env("LOCAL_RANK"),
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "timestamp": time.time(),
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    except OSError:
        return  # the directory is gone (launcher cleaned up): nothing to report to
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)


def _int_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _user_tb(tb):
    # Drop the leading frames of the launcher's ``-c`` line and of this
    # bootstrap: the user sees what plain python shows (runpy's frames for
    # ``-m`` included, as ``python -m`` shows them).
    while tb is not None and tb.tb_frame.f_code.co_filename in (_THIS, "<string>"):
        tb = tb.tb_next
    return tb


def _show_all_frames() -> bool:
    return os.environ.get("NDIST_DEBUG", "").strip().upper() in _DEBUG_LEVELS


def _ndist_dir() -> str:
    # This file is <ndist>/launch/_bootstrap.py.
    return os.path.dirname(os.path.dirname(os.path.realpath(_THIS))) + os.sep


def format_exception(exc: BaseException, tb=None, full: bool = False) -> str:
    """``exc`` as plain Python prints it, with each run of frames inside the ``ndist``
    package folded into one line, unless ``full``.

    Chained exceptions that happened entirely inside ndist (an ``OSError`` behind a
    ``DistNetworkError``) are left out of the short form: the ndist error's message says
    what they were. Returns ``""`` when nothing would be folded (the caller then prints
    what plain Python prints).
    """
    import traceback

    if tb is None:
        tb = exc.__traceback__
    te = traceback.TracebackException(type(exc), exc, tb, compact=True)
    if full:
        return "".join(te.format())
    root = _ndist_dir()
    cache: dict = {}

    def inside(filename: str) -> bool:
        if filename not in cache:
            cache[filename] = os.path.realpath(filename).startswith(root) if filename else False
        return cache[filename]

    folded = False
    seen, todo = set(), [te]
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if any(inside(fs.filename) for fs in t.stack):
            folded = True
            t.stack = _Folded(t.stack, inside)
        for attr in ("__cause__", "__context__"):
            linked = getattr(t, attr)
            if linked is None:
                continue
            if linked.stack and all(inside(fs.filename) for fs in linked.stack):
                setattr(t, attr, None)  # raised and handled inside ndist: its message says enough
                folded = True
            else:
                todo.append(linked)
        todo.extend(getattr(t, "exceptions", None) or ())
    return "".join(te.format()) if folded else ""


_folded_class = None


def _Folded(frames, inside):  # noqa: N802 - builds the class on first use: traceback is imported lazily
    """A StackSummary of ``frames`` whose runs of frames inside ndist print as one line."""
    global _folded_class
    if _folded_class is None:
        import traceback

        class Folded(traceback.StackSummary):
            def format(self, **kwargs):  # kwargs: Python 3.13's colorize
                lines, hidden = [], 0
                for fs in self:
                    if self.inside(fs.filename):
                        hidden += 1
                        continue
                    if hidden:
                        lines.append(_fold_line(hidden))
                        hidden = 0
                    lines.extend(traceback.StackSummary.from_list([fs]).format(**kwargs))
                if hidden:
                    lines.append(_fold_line(hidden))
                return lines

        _folded_class = Folded
    stack = _folded_class(frames)
    stack.inside = inside
    return stack


def _fold_line(n: int) -> str:
    return f"  [... {n} frame{'s' if n != 1 else ''} inside ndist (NDIST_DEBUG=INFO shows them) ...]\n"


def _excepthook(exc_type, exc, tb, _prev=sys.excepthook):
    tb = _user_tb(tb)
    if exc is not None:
        exc.__traceback__ = tb  # the default hook prints the exception's own traceback
        if not _show_all_frames():
            try:
                text = format_exception(exc, tb)
            except Exception:  # noqa: BLE001 - never lose the error over its formatting
                text = ""
            if text:
                sys.stderr.write(text)  # one write: the lines of two ranks do not interleave
                sys.stderr.flush()
                return
    _prev(exc_type, exc, tb)


def _run_script(path: str, args: list[str]) -> None:
    import builtins
    import io

    # The loader class plain ``python script.py`` puts in __main__, already loaded.
    SourceFileLoader = sys.modules["_frozen_importlib_external"].SourceFileLoader

    abspath = os.path.abspath(path)
    try:
        with io.open_code(abspath) as f:
            source = f.read()
    except OSError as err:
        # The exact message and status of ``python missing.py``.
        sys.stderr.write(f"{sys.executable}: can't open file {abspath!r}: [Errno {err.errno}] {err.strerror}\n")
        sys.exit(2)
    sys.argv[:] = [path, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(abspath))
    main_globals = sys.modules["__main__"].__dict__
    main_globals.clear()
    main_globals.update(
        __name__="__main__",
        __doc__=None,
        __package__=None,
        __loader__=SourceFileLoader("__main__", abspath),
        __spec__=None,
        __file__=abspath,
        __cached__=None,
        __builtins__=builtins,
    )
    code = compile(source, abspath, "exec", dont_inherit=True)
    exec(code, main_globals)


def _run_module(module: str, args: list[str]) -> None:
    import runpy

    sys.argv[:] = [module, *args]  # runpy sets argv[0] to the module's file, as ``python -m``
    sys.path[0] = os.getcwd()
    main_globals = sys.modules["__main__"].__dict__
    builtins = main_globals["__builtins__"]
    main_globals.clear()  # drop the names of the launcher's -c line
    main_globals["__builtins__"] = builtins
    run_as_main = getattr(runpy, "_run_module_as_main", None)
    if run_as_main is not None:
        run_as_main(module, alter_argv=True)
    else:  # pragma: no cover - every CPython since 2.7 has it
        runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(parent_pid: int, mode: str) -> None:
    """Entry point, called from the launcher's ``-c`` command line.

    ``mode`` is ``"script"`` (``sys.argv[1]`` is a file), ``"module"``
    (``-m``: ``sys.argv[1]`` is a module name) or ``"exec"`` (``--no-python``:
    replace this process with ``sys.argv[1:]``).
    """
    _die_with_parent(parent_pid)
    _bind_cpu()
    argv = sys.argv[1:]  # sys.argv[0] is "-c"
    if mode == "exec":
        try:
            os.execvp(argv[0], argv)
        except OSError as err:
            sys.stderr.write(f"ndistrun: cannot run {argv[0]!r}: {err.strerror}\n")
            sys.exit(127 if isinstance(err, FileNotFoundError) else 126)
    sys.excepthook = _excepthook
    try:
        if mode == "module":
            _run_module(argv[0], argv[1:])
        else:
            _run_script(argv[0], argv[1:])
    except SystemExit:
        raise
    except BaseException as exc:
        write_error_file(exc)
        raise
