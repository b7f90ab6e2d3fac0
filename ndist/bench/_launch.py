"""Start one library's ranks and drive them: ``RankGroup``.

mpi4py and ndist's ``mpi`` backend run under ``mpiexec -n N`` (MPICH's, found
next to the interpreter or on PATH); torch, deepspeed and ndist's ``socket``
backend run as N plain processes. Every rank connects back to a listener on 127.0.0.1
(port 0) and proves the per-run key (``multiprocessing.connection``'s HMAC
challenge, both ways) before anything is unpickled.

A caller that places the ranks elsewhere (``benchmarks/multihost.py``: network
namespaces as hosts) gives ``RankGroup`` the commands that start them and a Unix
socket to listen on instead (a path reaches across network namespaces; 127.0.0.1
does not).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge, wait

from ._adapters import Adapter, adapter_class

__all__ = ["RankGroup", "rank_command", "BenchError", "find_mpiexec", "MPI_LIBRARIES", "AUTHKEY_ENV", "BIND_CPU_ENV",
           "mpich_segments", "remove_orphan_mpich_segments", "hydra_files", "mpiexec_running", "hydra_files_left",
           "remove_orphan_hydra_files"]

AUTHKEY_ENV = "NDIST_BENCH_AUTHKEY"  # the per-run key, hex, in each rank's environment
#: the CPU a rank binds itself to (the variable ``ndistrun --bind-to core`` sets for its ranks)
BIND_CPU_ENV = "NDIST_BIND_CPUS"

log = logging.getLogger("ndist.bench")

_SHM = "/dev/shm"
_MPICH_SHM = "mpich_shm_"


def _names(folder: str, prefix: str) -> set:
    try:
        return {n for n in os.listdir(folder) if n.startswith(prefix)}
    except OSError:
        return set()


def _unlink(folder: str, names) -> list:
    """Remove ``names`` from ``folder``; the names removed, in order."""
    gone = []
    for name in sorted(names):
        try:
            os.unlink(os.path.join(folder, name))
            gone.append(name)
        except OSError:
            pass
    return gone


def mpich_segments() -> set:
    """The names of MPICH's shared-memory segments in /dev/shm now."""
    return _names(_SHM, _MPICH_SHM)


def _mapped_mpich_segments() -> set:
    mapped = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    at = line.find(f"{_SHM}/{_MPICH_SHM}")
                    if at >= 0:
                        mapped.add(line[at + len(_SHM) + 1:].split()[0])
        except OSError:
            continue
    return mapped


def remove_orphan_mpich_segments(before: set, settle: float = 2.0) -> list:
    """Remove MPICH's segments that appeared since ``before`` and that no live process
    maps: MPICH unlinks its segment at ``MPI_Finalize``, so a job killed or aborted before
    it leaves the file behind. A segment still mapped is given ``settle`` seconds (the
    killed ranks may still be exiting), then stays (a live job). Returns the names removed."""
    new = mpich_segments() - before
    if not new:
        return []
    until = time.monotonic() + settle
    mapped = _mapped_mpich_segments() & new
    while mapped and time.monotonic() < until:
        time.sleep(0.05)
        mapped = _mapped_mpich_segments() & new
    return _unlink(_SHM, new - mapped)


HYDRA_TMP = "/tmp"
HYDRA_FILE = "hydra_hwloc_xmlfile_"


def hydra_files() -> set:
    """The topology files MPICH's mpiexec (Hydra) has in /tmp now (one per job it runs)."""
    return _names(HYDRA_TMP, HYDRA_FILE)


def mpiexec_running() -> bool:
    """Whether any ``mpiexec`` process runs on this machine now."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("mpiexec"):
                return True
        except OSError:
            pass
    return False


def hydra_files_left(before: set) -> list:
    """The Hydra topology files that appeared since ``before`` and are still there, sorted;
    none while an ``mpiexec`` runs (another job's file cannot be told from the one a test
    watched, e.g. another pytest worker's)."""
    new = hydra_files() - before
    return [] if not new or mpiexec_running() else sorted(new)


def remove_orphan_hydra_files(before: set) -> list:
    """Remove the Hydra topology files that appeared since ``before``, once no ``mpiexec``
    runs: Hydra removes its file when its job ends, except after an ``MPI_Abort`` (seen with
    MPICH 5.0 and a plain mpi4py program) or a SIGKILL. A file that appeared while another
    ``mpiexec`` runs cannot be told from that job's, so nothing is removed then. Returns the
    names removed."""
    return _unlink(HYDRA_TMP, hydra_files_left(before))


MPI_LIBRARIES = ("mpi4py", "ndist[mpi]")


def bound_like_ndistrun(lib: str) -> bool:
    """Whether ndist-bench places ``lib``'s ranks as ``ndistrun --bind-to`` would: ndist's own
    ranks (not under mpiexec) and torch on backend "ndist" (``torch:ndist*``: ndist's engine
    under torch, launched by ndistrun in docs/torch.md's recipes), so that the torch layer's
    cost is measured at the same placement as ndist's own API. The others run as their
    launchers' defaults place them (mpiexec: Hydra binds nothing; torchrun and DeepSpeed's
    launcher bind nothing)."""
    return (lib.startswith("ndist[") and lib not in MPI_LIBRARIES) or lib.startswith("torch:ndist")
#: how long a killed MPI job's ``mpiexec`` gets to end its ranks itself after SIGTERM
MPIEXEC_TERM_S = 3.0


def _terminate_mpiexec(proc: subprocess.Popen, grace: float = MPIEXEC_TERM_S) -> None:
    """SIGTERM to MPICH's ``mpiexec`` (Hydra), and up to ``grace`` seconds for it to exit: it
    ends its proxies and ranks and removes its ``/tmp/hydra_hwloc_xmlfile_*``, which a
    SIGKILL leaves behind. What still runs after that is the caller's to SIGKILL."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except (subprocess.TimeoutExpired, OSError):
        pass


class BenchError(RuntimeError):
    """A library's ranks failed to start, crashed, or timed out."""


def find_mpiexec() -> str | None:
    """MPICH's ``mpiexec`` next to ``sys.executable`` (the mpich wheel), else on PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("mpiexec", path=here) or shutil.which("mpiexec")


def _ndist_root() -> str:
    import ndist

    return os.path.dirname(os.path.dirname(os.path.abspath(ndist.__file__)))


def _child_env(authkey: bytes, timeout: float, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(extra or {})  # what the library's adapter asks for (``Adapter.environment``)
    root = _ndist_root()
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop(BIND_CPU_ENV, None)  # (a driver that runs in a bound rank: its CPUs are not its ranks')
    env[AUTHKEY_ENV] = authkey.hex()
    env["NDIST_BENCH_TIMEOUT"] = str(timeout)
    env.setdefault("NDIST_SECRET", secrets.token_hex(16))  # ndist's job secret, as ndistrun sets it
    # N ranks share the cores: one compute thread each, the same for every library.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(var, "1")
    return env


def rank_command(lib: str, rank, nproc: int, address: str) -> list[str]:
    """The command of one benchmark rank of ``lib`` (``python -m ndist.bench._worker ...``) that
    connects back to a ``RankGroup`` listening at ``address``. ``rank``: an int, or ``"env"``
    for the rank its launcher gives it (``PMI_RANK`` under mpiexec, ``RANK`` under ndistrun)."""
    return [sys.executable, "-m", "ndist.bench._worker", lib, str(rank), str(nproc), address]


class RankGroup:
    """The ``nproc`` ranks of one library, started once and reused for every size.

    ``commands(address)``: the commands that start the ranks, given the address they
    connect back to (default: ``mpiexec -n nproc`` for the MPI libraries, else one
    process per rank, all on this machine). A rank that gets ``env`` for its rank learns
    it from its launcher's variables (``PMI_RANK``, ``RANK``, ...). ``listen``: a path
    for a Unix socket to listen on, instead of a TCP port on 127.0.0.1. ``cpus``: with the
    default commands of a library not under mpiexec, the CPUs each rank binds itself to, a
    tuple per rank (``NDIST_BIND_CPUS``, as under ``ndistrun --bind-to core``); empty: unbound."""

    def __init__(self, lib: str, nproc: int, timeout: float = 300.0, *, commands=None, listen: str | None = None,
                 cpus: tuple[tuple[int, ...], ...] = ()):
        if cpus and (len(cpus) != nproc or commands is not None or lib in MPI_LIBRARIES):
            raise ValueError(f"cpus: expected the CPUs of each rank ({nproc}) for ranks RankGroup starts itself, "
                             f"not under mpiexec; got {cpus!r} for {lib!r}"
                             + (" with commands" if commands is not None else ""))
        self.cpus = tuple(cpus)
        self.lib, self.nproc, self.timeout = lib, nproc, timeout
        self._custom_commands = commands
        self._listen_path = listen
        self.procs: list[subprocess.Popen] = []
        self.conns: dict[int, Connection] = {}
        self.ranks: dict[int, dict] = {}  # rank -> {"pid", "host"}
        self.versions: dict = {}
        self._segments: set = set()  # MPICH's segments before start (``kill``)
        self.command: list[str] = []
        # names this group while it starts (``Adapter.environment``): the listener's port, or a random number
        self.tag = ""
        self._adapter = adapter_class(lib) or Adapter
        self._log = tempfile.TemporaryFile(mode="w+b")

    # ------------------------------------------------------------------ start

    def _commands(self, address: str) -> list[list[str]]:
        if self.lib in MPI_LIBRARIES:
            mpiexec = find_mpiexec()
            if mpiexec is None:
                raise BenchError(f"{self.lib}: mpiexec not found next to {sys.executable} or on PATH (pip install mpich)")
            return [[mpiexec, "-n", str(self.nproc), *rank_command(self.lib, "env", self.nproc, address)]]
        return [rank_command(self.lib, r, self.nproc, address) for r in range(self.nproc)]

    def _listener(self) -> tuple[socket.socket, str, str]:
        """``(socket, address the ranks dial, tag)``: a TCP port on 127.0.0.1, or the Unix socket ``listen``."""
        if self._listen_path is None:
            lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                lsock.bind(("127.0.0.1", 0))
            except BaseException:
                lsock.close()
                raise
            port = lsock.getsockname()[1]
            return lsock, f"127.0.0.1:{port}", str(port)
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lsock.bind(self._listen_path)
        except BaseException:
            lsock.close()
            raise
        return lsock, self._listen_path, str(1024 + secrets.randbelow(60000))

    def start(self) -> "RankGroup":
        self._segments = mpich_segments()  # (what a killed MPI job leaves is removed: ``kill``)
        authkey = secrets.token_bytes(32)
        lsock, address, self.tag = self._listener()
        try:
            lsock.listen(self.nproc)
            env = _child_env(authkey, self.timeout, self._adapter.environment(self.nproc, self.tag))
            cmds = (self._custom_commands or self._commands)(address)
            self.command = cmds[0]
            for i, cmd in enumerate(cmds):
                own = {**env, BIND_CPU_ENV: ",".join(map(str, self.cpus[i]))} if self.cpus else env
                self.procs.append(subprocess.Popen(
                    cmd, env=own, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                    start_new_session=True,
                ))
            deadline = time.monotonic() + self.timeout
            pending = []
            while len(pending) < self.nproc:
                self._check_alive("while starting")
                lsock.settimeout(min(0.5, max(0.01, deadline - time.monotonic())))
                try:
                    s, _ = lsock.accept()
                except socket.timeout:
                    if time.monotonic() > deadline:
                        raise BenchError(f"{self.lib}: {len(pending)} of {self.nproc} ranks connected "
                                         f"within {self.timeout:.0f} s{self._log_tail()}") from None
                    continue
                s.setblocking(True)  # Connection reads the raw fd: no O_NONBLOCK left over
                conn = Connection(s.detach())
                try:
                    deliver_challenge(conn, authkey)
                    answer_challenge(conn, authkey)
                except Exception as e:  # someone else connected: drop it, keep waiting
                    log.warning("rejected a connection to %s: %s", address, e)
                    conn.close()
                    continue
                pending.append(conn)
            for conn in pending:
                hello = self._recv(conn, deadline, "hello")
                self.conns[hello["rank"]] = conn
                self.ranks[hello["rank"]] = {"pid": hello["pid"], "host": hello["host"], "cpus": hello.get("cpus")}
            if sorted(self.conns) != list(range(self.nproc)):
                raise BenchError(f"{self.lib}: expected ranks 0..{self.nproc - 1}; got {sorted(self.conns)}")
            self._await_ready(deadline)
        except BaseException:
            self.kill()
            raise
        finally:
            lsock.close()
            if self._listen_path is not None:
                try:
                    os.unlink(self._listen_path)
                except FileNotFoundError:
                    pass
        return self

    def _await_ready(self, deadline: float) -> None:
        ready: set[int] = set()
        waiting: list[int] = []
        published, value = False, None
        while len(ready) < self.nproc:
            for rank, msg in self._recv_any(deadline, "ready", [r for r in self.conns if r not in ready]):
                if msg["kind"] == "publish":
                    if rank == 0:
                        published, value = True, msg["value"]
                    waiting.append(rank)
                    if published:
                        for r in waiting:
                            self.conns[r].send({"kind": "published", "value": value})
                        waiting.clear()
                elif msg["kind"] == "ready":
                    ready.add(rank)
                    self.versions = msg["versions"]

    # -------------------------------------------------------------- messaging

    def _log_tail(self, limit: int = 4000) -> str:
        try:
            self._log.flush()
            self._log.seek(0, os.SEEK_END)
            end = self._log.tell()
            self._log.seek(max(0, end - limit))
            text = self._log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""
        return f"\n--- output of {self.lib} ranks (tail) ---\n{text}" if text else ""

    def _check_alive(self, what: str) -> None:
        for p in self.procs:
            rc = p.poll()
            if rc is not None:  # nobody exits while a message is still owed
                raise BenchError(f"{self.lib}: rank process {p.pid} exited with code {rc} {what}{self._log_tail()}")

    def _raise_error(self, msg: dict) -> None:
        raise BenchError(f"{self.lib}: rank {msg['rank']} failed:\n{msg['traceback']}{self._log_tail()}")

    def _recv(self, conn: Connection, deadline: float, what: str) -> dict:
        while not conn.poll(0.5):
            self._check_alive(f"while waiting for {what}")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.lib}: no {what} within {self.timeout:.0f} s (a hang, or a size too large "
                                 f"for --timeout){self._log_tail()}")
        msg = self._recv_msg(conn, what)
        if msg["kind"] == "error":
            self._raise_error(msg)
        return msg

    def _recv_msg(self, conn: Connection, what: str) -> dict:
        try:
            return conn.recv()
        except (EOFError, OSError):
            self._check_alive(f"while waiting for {what}")
            raise BenchError(f"{self.lib}: a rank closed its connection while waiting for {what}"
                             f"{self._log_tail()}") from None

    def _recv_any(self, deadline: float, what: str, ranks=None):
        """Messages from whichever of ``ranks`` (default: all) have one."""
        ranks = self.conns if ranks is None else ranks
        by_conn = {id(self.conns[r]): r for r in ranks}
        ready = wait([self.conns[r] for r in ranks], timeout=0.5)
        if not ready:
            self._check_alive(f"while waiting for {what}")
            if time.monotonic() > deadline:
                raise BenchError(f"{self.lib}: no {what} from every rank within {self.timeout:.0f} s"
                                 f"{self._log_tail()}")
        out = []
        for c in ready:
            msg = self._recv_msg(c, what)
            if msg["kind"] == "error":
                self._raise_error(msg)
            out.append((by_conn[id(c)], msg))
        return out

    # --------------------------------------------------------------------- use

    def run(self, request: dict) -> list[dict]:
        """Send ``request`` to every rank; their results, by rank."""
        deadline = time.monotonic() + self.timeout
        for conn in self.conns.values():
            conn.send({"kind": "run", **request})
        results: dict[int, dict] = {}
        what = f"{request['op']} {request['nbytes']} B"
        while len(results) < self.nproc:
            for rank, msg in self._recv_any(deadline, what, [r for r in self.conns if r not in results]):
                results[rank] = msg
        return [results[r] for r in range(self.nproc)]

    def stop(self) -> None:
        """Close every rank's library and wait for the processes; kill on trouble."""
        try:
            deadline = time.monotonic() + min(self.timeout, 60.0)
            for conn in self.conns.values():
                conn.send({"kind": "stop"})
            done: set[int] = set()
            while len(done) < self.nproc:
                for rank, msg in self._recv_any(deadline, "stop", [r for r in self.conns if r not in done]):
                    done.add(rank)
            for p in self.procs:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except (BenchError, OSError, subprocess.TimeoutExpired) as e:
            log.warning("%s did not stop cleanly: %s", self.lib, e)
        finally:
            self.kill()

    def kill(self) -> None:
        """Terminate every process this group started (its own session) and close up."""
        for conn in self.conns.values():
            conn.close()
        self.conns = {}
        killed = False
        for p in self.procs:
            if p.poll() is None:
                killed = True
                if self.lib in MPI_LIBRARIES:
                    _terminate_mpiexec(p)
                try:
                    os.killpg(p.pid, signal.SIGKILL)  # (what is left of its session)
                except (ProcessLookupError, PermissionError):
                    p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("process %d of %s did not exit", p.pid, self.lib)
        if killed and self.lib in MPI_LIBRARIES:
            remove_orphan_mpich_segments(self._segments)
        if self.tag:
            for path in self._adapter.leftovers(self.nproc, self.tag):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as e:
                    log.warning("could not remove %s of %s: %s", path, self.lib, e)
        self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        if exc[0] is None:
            self.stop()
        else:
            self.kill()
