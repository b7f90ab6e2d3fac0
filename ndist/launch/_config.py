"""Command line of ``ndistrun``: the parser and the validated ``LaunchConfig``.

Option names follow torchrun; both ``--nproc-per-node`` and
``--nproc_per_node`` spellings are accepted. Every problem is reported by
``argparse`` (exit status 2) naming the option, what it expects and what it
got, before anything is started.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from ._binding import plan

__all__ = ["LaunchConfig", "build_parser", "parse_args", "parse_std_spec", "DEFAULT_MULTINODE_PORT"]

DEFAULT_MULTINODE_PORT = 29500
DEFAULT_PREFIX = "[rank${rank}]:"

_EPILOG = """\
examples:
  ndistrun --nproc-per-node 4 train.py --epochs 3     4 ranks on this machine
  ndistrun --nproc-per-node 2 -m mypkg.train          run a module, like python -m
  ndistrun --nproc-per-node 2 --tee 3 --log-dir logs train.py
                                                      console and per-rank log files
  # two nodes, 8 ranks each (same NDIST_SECRET on both; port 29500 open on node 0):
  export NDIST_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')
  node0$ ndistrun --nnodes 2 --node-rank 0 --master-addr node0 --nproc-per-node 8 train.py
  node1$ ndistrun --nnodes 2 --node-rank 1 --master-addr node0 --nproc-per-node 8 train.py

environment:
  NDIST_SECRET   job secret; required on every node of a multi-node job
  NDIST_DEBUG    INFO or DETAIL: ndist logs of the launcher and the ranks on stderr

Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT and NDIST_STORE, so init_process_group() needs no arguments.
Exit status: 0 when every rank succeeded, else the first failing rank's
(128 + signal when killed); 2 for bad arguments. When a rank fails, the
summary names it with its host, exit code and traceback. With
--on-failure continue the other ranks run on; the exit status is 0 when at
least --min-nproc ranks finished with status 0. With --on-failure replace a
new process also takes the lost rank's place (NDIST_REPLACES, NDIST_REPLACEMENT).
See docs/launch.md and docs/troubleshooting.md.
"""

# bit 1: stdout, bit 2: stderr (torchrun's Std: 0 none, 1 out, 2 err, 3 all)
STDOUT, STDERR = 1, 2


@dataclass(frozen=True)
class LaunchConfig:
    """Everything one ``ndistrun`` agent needs, validated."""

    entrypoint: str
    args: tuple[str, ...] = ()
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    max_restarts: int = 0
    log_dir: str | None = None
    redirects: tuple[int, ...] = ()  # per local rank, STDOUT|STDERR bits
    tee: tuple[int, ...] = ()
    local_ranks_filter: frozenset[int] | None = None
    module: bool = False
    no_python: bool = False
    rdzv_timeout: float = 600.0
    run_id: str = ""
    term_timeout: float = 5.0
    prefix_template: str = DEFAULT_PREFIX
    #: "stop": a failed rank ends the job; "continue": the others run on; "replace": the others
    #: run on and a new process takes the lost rank's place (``--max-restarts`` times per rank)
    on_failure: str = "stop"
    min_nproc: int = 1  # with "continue": ranks that must finish with status 0 for exit status 0
    #: several nodes: why this node's ranks cannot start (its script is missing here), told to
    #: every node at the rendezvous, which all refuse the job with it (one node: a usage error)
    entry_problem: str | None = None
    #: ``--bind-to``, resolved: "core" (each local rank bound to CPUs of its own, ``bind_cpus``) or "none"
    bind_to: str = "none"
    bind_cpus: tuple[tuple[int, ...], ...] = ()  # with "core": each local rank's CPUs, from the launcher's mask

    @property
    def keep_going(self) -> bool:
        """``--on-failure continue`` or ``replace``: a lost rank does not stop the others."""
        return self.on_failure in ("continue", "replace")

    @property
    def replacing(self) -> bool:
        """``--on-failure replace``: a lost rank is replaced, ``max_restarts`` times per rank."""
        return self.on_failure == "replace"

    @property
    def group_restarts(self) -> int:
        """How many times the whole worker group may start again (``--max-restarts``, except
        with ``replace``, where it counts the replacements of each rank instead)."""
        return 0 if self.replacing else self.max_restarts

    @property
    def single_node(self) -> bool:
        return self.nnodes == 1

    def redirect_of(self, local_rank: int) -> int:
        return self.redirects[local_rank] if self.redirects else 0

    def tee_of(self, local_rank: int) -> int:
        return self.tee[local_rank] if self.tee else 0

    def on_console(self, local_rank: int) -> bool:
        return self.local_ranks_filter is None or local_rank in self.local_ranks_filter


def build_parser(prog: str = "ndistrun") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description="Start NPROC_PER_NODE ranks of a Python program on this node (torchrun's options).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a = p.add_argument_group("ranks and nodes").add_argument
    a("--nproc-per-node", "--nproc_per_node", default="1", metavar="N",
      help="ranks on this node: an int, 'auto' or 'cpu' (the CPUs this process may use). Default 1.")
    a("--nnodes", default="1", metavar="N", help="number of nodes (an int; MIN:MAX only with MIN == MAX). Default 1.")
    a("--node-rank", "--node_rank", default="0", metavar="R", help="rank of this node, 0..NNODES-1. Default 0.")
    a("--bind-to", "--bind_to", default=None, metavar="core|core:N|core:overload-allowed|none",
      help="'core': bind each local rank to CPUs of its own, an equal share of whole cores of this launcher's "
           "affinity mask; 'core:N': N whole cores each; 'core:overload-allowed': as 'core', and with more "
           "local ranks than CPUs one CPU each, shared evenly; 'none': leave the ranks unbound. Default: core "
           "when there are at least 2 local ranks and as many usable CPUs, else none.")
    a = p.add_argument_group("rendezvous (multi-node: where node 0's store is)").add_argument
    a("--master-addr", "--master_addr", default=None, metavar="HOST",
      help="host of node 0, where the launcher's store runs (default 127.0.0.1 on one node).")
    a("--master-port", "--master_port", default=None, metavar="PORT",
      help=f"store port on node 0 (default: a free port on one node, {DEFAULT_MULTINODE_PORT} on several).")
    a("--rdzv-endpoint", "--rdzv_endpoint", default=None, metavar="HOST[:PORT]",
      help="same as --master-addr HOST --master-port PORT.")
    a("--rdzv-id", "--rdzv_id", "--run-id", "--run_id", dest="run_id", default=None, metavar="ID",
      help="job id: names the log directory and is passed to ranks as NDIST_RUN_ID (default: random).")
    a("--rdzv-timeout", "--rdzv_timeout", default="600", metavar="SECONDS",
      help="how long the agents of a multi-node job wait for each other to start. Default 600.")
    a("--standalone", action="store_true", help="single-node job with a private store on a free port (the default for --nnodes 1).")
    a = p.add_argument_group("failures").add_argument
    a("--max-restarts", "--max_restarts", default=None, metavar="N",
      help="restart the whole local worker group up to N times when a rank fails (with --on-failure "
           "continue: when fewer than --min-nproc ranks can still finish). Default 0. With --on-failure "
           "replace: how many times each rank may be replaced (default 3).")
    a("--on-failure", "--on_failure", default="stop", metavar="stop|continue|replace",
      help="when a rank fails: 'stop' every rank (default), 'continue' with the others, listing each lost "
           "rank in the summary, or 'replace' it: the others run on and a new process takes its place, "
           "which the others admit with grow_group().")
    a("--min-nproc", "--min_nproc", default=None, metavar="N",
      help="with --on-failure continue or replace: the job succeeds (exit status 0) when at least N ranks "
           "finish with status 0, and is stopped as soon as fewer than N can. Default 1.")
    a("--term-timeout", "--term_timeout", default="5", metavar="SECONDS",
      help="grace period between SIGTERM and SIGKILL when ranks are torn down. Default 5.")
    a = p.add_argument_group("output and logs").add_argument
    a("--log-dir", "--log_dir", default=None, metavar="DIR",
      help="base directory for per-rank logs and error files (a subdirectory per job; "
           "default: a temporary directory, kept only with --redirects or --tee).")
    a("-r", "--redirects", default="0", metavar="SPEC",
      help="send rank streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both; or per local rank: 0:1,1:2.")
    a("-t", "--tee", default="0", metavar="SPEC",
      help="copy rank streams to log files and the console; same values as --redirects.")
    a("--local-ranks-filter", "--local_ranks_filter", default="", metavar="RANKS",
      help="show console output of these local ranks only (comma-separated). Log files are not filtered.")
    a("--log-line-prefix-template", "--log_line_prefix_template", default=DEFAULT_PREFIX, metavar="TEMPLATE",
      help="prefix of every forwarded line: ${rank}, ${local_rank}, ${role_name}. '' turns prefixing off. "
           f"Default {DEFAULT_PREFIX!r}.")
    run = p.add_argument_group("what to run (default: a Python script file)")
    a = run.add_argument
    g = run.add_mutually_exclusive_group()
    g.add_argument("-m", "--module", action="store_true",
                   help="run the entry point as a module, like python -m.")
    g.add_argument("--no-python", "--no_python", action="store_true",
                   help="run the entry point as an executable, not through python.")
    a("--run-path", "--run_path", action="store_true", help=argparse.SUPPRESS)  # refused below, with a reason
    a("training_script", metavar="script", help="the program: a .py file, a module with -m, an executable with --no-python.")
    a("training_script_args", nargs=argparse.REMAINDER, metavar="...", help="arguments passed to the program.")
    return p


def _int(p, opt: str, raw: str, lo: int | None = None, hi: int | None = None) -> int:
    try:
        v = int(raw)
    except (TypeError, ValueError):
        p.error(f"{opt}: expected an integer, got {raw!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        p.error(f"{opt}: expected an integer {rng}, got {v}")
    return v


def _seconds(p, opt: str, raw: str) -> float:
    try:
        v = float(raw)
    except (TypeError, ValueError):
        p.error(f"{opt}: expected a number of seconds, got {raw!r}")
    if not v > 0 or v != v or v == float("inf"):
        p.error(f"{opt}: expected a positive number of seconds, got {raw!r}")
    return v


def parse_std_spec(raw: str, nproc: int, opt: str = "--redirects") -> tuple[int, ...]:
    """``"3"`` → every local rank 3; ``"0:1,1:2"`` → per local rank (others 0). Raises ValueError."""
    raw = raw.strip()
    expected = "0-3 (0 none, 1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3 pairs like 0:1,1:2"
    if ":" not in raw:
        if raw not in ("0", "1", "2", "3"):
            raise ValueError(f"{opt}: expected {expected}, got {raw!r}")
        return (int(raw),) * nproc
    out = [0] * nproc
    for part in raw.split(","):
        lr, sep, v = part.strip().partition(":")
        if not sep or not lr.strip().isdigit() or v.strip() not in ("0", "1", "2", "3"):
            raise ValueError(f"{opt}: expected {expected}, got {raw!r} (bad item {part!r})")
        r = int(lr)
        if r >= nproc:
            raise ValueError(f"{opt}: local rank {r} in {raw!r} is not in 0..{nproc - 1} (--nproc-per-node {nproc})")
        out[r] = int(v)
    return tuple(out)


def _nproc(p, raw: str) -> int:
    if raw in ("auto", "cpu"):
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not Linux
            return os.cpu_count() or 1
    if raw == "gpu":
        p.error("--nproc-per-node: 'gpu' is not supported by ndistrun; give a number (one rank per GPU)")
    try:
        v = int(raw)
    except ValueError:
        p.error(f"--nproc-per-node: expected a positive integer, 'auto' or 'cpu', got {raw!r}")
    if v < 1:
        p.error(f"--nproc-per-node: expected a positive integer, 'auto' or 'cpu', got {v}")
    return v


def _nnodes(p, raw: str) -> int:
    lo, sep, hi = raw.partition(":")
    if sep:
        a, b = _int(p, "--nnodes", lo, 1), _int(p, "--nnodes", hi, 1)
        if a != b:
            p.error(f"--nnodes: elastic ranges (MIN:MAX) are not supported; give a fixed number of nodes, got {raw!r}")
        return a
    return _int(p, "--nnodes", raw, 1)


def parse_args(argv: list[str] | None = None, prog: str = "ndistrun") -> LaunchConfig:
    p = build_parser(prog)
    ns = p.parse_args(argv)
    nproc = _nproc(p, ns.nproc_per_node)
    nnodes = _nnodes(p, ns.nnodes)
    if ns.standalone and nnodes != 1:
        p.error(f"--standalone: runs a single-node job, but --nnodes is {nnodes}")
    node_rank = _int(p, "--node-rank", ns.node_rank, 0, nnodes - 1)
    addr, port = ns.master_addr, ns.master_port
    if ns.rdzv_endpoint:
        if addr is not None or port is not None:
            p.error("--rdzv-endpoint: give either it or --master-addr/--master-port, not both")
        host, sep, prt = ns.rdzv_endpoint.rpartition(":")
        if not sep or not prt.isdigit() or (host.count(":") and not host.endswith("]")):
            host, prt = ns.rdzv_endpoint, None  # no port (a bare IPv6 address has colons too)
        addr, port = host.strip("[]") or None, prt
    if addr is not None and not addr.strip():
        p.error("--master-addr: expected a host name or address, got ''")
    port = None if port is None else _int(p, "--master-port", port, 0, 65535)
    if nnodes > 1 and port == 0:
        p.error("--master-port: a multi-node job needs a fixed port every node can reach, got 0")
    if nnodes > 1 and addr is None and node_rank != 0:
        p.error(f"--master-addr: required on node {node_rank} of a {nnodes}-node job (the host of node 0)")
    try:
        redirects = parse_std_spec(ns.redirects, nproc, "--redirects")
        tee = parse_std_spec(ns.tee, nproc, "--tee")
    except ValueError as err:
        p.error(str(err))
    flt = None
    if ns.local_ranks_filter.strip():
        items = [s.strip() for s in ns.local_ranks_filter.split(",")]
        if not all(s.isdigit() for s in items):
            p.error(f"--local-ranks-filter: expected comma-separated local ranks like 0,2, got {ns.local_ranks_filter!r}")
        flt = frozenset(int(s) for s in items)
        bad = sorted(r for r in flt if r >= nproc)
        if bad:
            p.error(f"--local-ranks-filter: local ranks {bad} are not in 0..{nproc - 1} (--nproc-per-node {nproc})")
    if ns.on_failure not in ("stop", "continue", "replace"):
        p.error(f"--on-failure: expected 'stop', 'continue' or 'replace', got {ns.on_failure!r}")
    min_nproc = 1
    if ns.min_nproc is not None:
        if ns.on_failure == "stop":
            p.error(f"--min-nproc: applies to --on-failure continue or replace only (with 'stop' the first failure "
                    f"ends the job), got --min-nproc {ns.min_nproc} with --on-failure {ns.on_failure}")
        # the job's total is known here on one node; on several, once the nodes have joined (_rdzv)
        min_nproc = _int(p, "--min-nproc", ns.min_nproc, 1)
        if nnodes == 1 and min_nproc > nproc:
            p.error(f"--min-nproc: expected an integer in 1..{nproc} (the job's ranks: --nproc-per-node {nproc}), "
                    f"got {min_nproc}")
    try:
        bind_to, bind_cpus = plan(ns.bind_to, nproc)
    except ValueError as err:
        p.error(str(err))
    if ns.run_path:
        p.error("--run-path is not supported: every rank runs its script in a fresh interpreter with the "
                "semantics of 'python script.py' already; drop the option")
    entry_problem = None
    if not ns.module and not ns.no_python and not os.path.isfile(ns.training_script):
        if os.path.exists(ns.training_script):
            entry_problem = (f"script: expected a Python file, got the directory {ns.training_script!r} "
                             "(use -m for a package)")
        else:
            entry_problem = (f"script: no such file: {ns.training_script!r} (use -m for a module, --no-python for "
                             "an executable)")
        if nnodes == 1:
            p.error(entry_problem)
    if ns.log_dir is not None and os.path.exists(ns.log_dir) and not os.path.isdir(ns.log_dir):
        p.error(f"--log-dir: expected a directory, got the file {ns.log_dir!r}")
    run_id = ns.run_id
    if run_id is not None and (not run_id or "/" in run_id or run_id in (".", "..")):
        p.error(f"--rdzv-id: expected a non-empty id without '/', got {run_id!r}")
    if run_id is None:
        run_id = os.urandom(4).hex()
    return LaunchConfig(
        entrypoint=ns.training_script,
        args=tuple(ns.training_script_args),
        nproc_per_node=nproc,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=addr,
        master_port=port,
        max_restarts=_int(p, "--max-restarts", ns.max_restarts if ns.max_restarts is not None
                          else "3" if ns.on_failure == "replace" else "0", 0),
        log_dir=ns.log_dir,
        redirects=redirects if any(redirects) else (),
        tee=tee if any(tee) else (),
        local_ranks_filter=flt,
        module=ns.module,
        no_python=ns.no_python,
        rdzv_timeout=_seconds(p, "--rdzv-timeout", ns.rdzv_timeout),
        run_id=run_id,
        term_timeout=_seconds(p, "--term-timeout", ns.term_timeout),
        prefix_template=ns.log_line_prefix_template,
        on_failure=ns.on_failure,
        min_nproc=min_nproc,
        entry_problem=entry_problem,
        bind_to=bind_to,
        bind_cpus=bind_cpus,
    )
