"""Several "hosts" on one machine: network namespaces, and ndistrun launched in each.

Two hosts are joined by one veth pair (10.77.0.1/24 and 10.77.0.2/24); more
hosts each get a veth pair whose other end sits on a bridge in one more
namespace (the "switch"), addresses 10.77.0.1, .2, ... Nothing touches the
machine's own namespace, and every name carries a random tag, so runs at the
same time do not meet. ``make_hosts`` returns once every link is up
(``Hosts.wait_up``). Needs root, iproute2 and CAP_NET_ADMIN: ``make_hosts``
calls ``skip`` otherwise. Public through ``ndist.testing``; used by the multi-host
tests and by ``benchmarks/multihost.py``, ``multihost_cpu.py`` and ``link_floor.py``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

#: the folder that holds this ``ndist`` package: the launchers' PYTHONPATH, so the ranks in
#: the namespaces import the same ndist
_IMPORT_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["Hosts", "make_hosts", "namespaces", "skip_unless_mpich_hosts", "free_port_in", "node_commands",
           "launch_nodes", "wait_launchers", "ndist_env", "outputs", "inside"]

_CLONE_NEWNET = 0x40000000


def sh(*args, check=True):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=30, check=check)


class Hosts:
    """``ns[i]``: host i's namespace; ``veth[i]``: its interface; ``addr[i]``: its address."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.ns: list[str] = []
        self.veth: list[str] = []
        self.addr: list[str] = []
        self.switch: str | None = None
        self.ports: list[str] = []  # the switch's end of each host's link (3 hosts or more)

    def _link(self, ns: str, dev: str, *opts: str) -> dict:
        return json.loads(sh("ip", "-j", *opts, "-n", ns, "link", "show", "dev", dev).stdout)[0]

    def wait_up(self, timeout: float = 10.0) -> None:
        """Wait until every host's interface is up with its carrier (``operstate`` UP: both
        ends of its veth are up) and, with a switch, every bridge port forwards.
        ``RuntimeError`` after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            down = [f"{ns}/{dev}: {st}" for ns, dev in zip(self.ns, self.veth)
                    if (st := self._link(ns, dev).get("operstate")) != "UP"]
            for port in self.ports:
                info = self._link(self.switch, port, "-d").get("linkinfo", {}).get("info_slave_data", {})
                if info.get("state") != "forwarding":
                    down.append(f"{self.switch}/{port}: bridge port {info.get('state')}")
            if not down:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"links not up within {timeout} s: {', '.join(down)}")
            time.sleep(0.05)

    def link_bytes(self) -> int:
        """Bytes the hosts' interfaces sent so far, all hosts together (every byte
        between hosts leaves through one of them)."""
        return sum(self._link(ns, dev, "-s")["stats64"]["tx"]["bytes"] for ns, dev in zip(self.ns, self.veth))

    def congestion(self, name: str | None) -> str:
        """TCP congestion control ``name`` on the routes between the hosts (``ip route ...
        congctl``, in every host's namespace: a namespace's own default may only be set to
        algorithms the machine's ``tcp_allowed_congestion_control`` lists), or, with None,
        the kernel's default left as it is. Returns what the connections between the
        hosts use. ``ValueError`` naming ``name`` when the kernel does not offer it.

        Why it matters here: veth delivers a packet into the receive backlog of the CPU that
        sent it, so segments of one flow sent from two CPUs (the application on one, a pacing
        timer or an ACK on another, as under BBR) can arrive out of order, which a real NIC's
        queue keeps in order; TCP then retransmits (``retransmits``)."""
        default = sh("ip", "netns", "exec", self.ns[0], "cat", "/proc/sys/net/ipv4/tcp_congestion_control").stdout.strip()
        if name is None:
            return f"{default} (the kernel's default)"
        offered = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
        if name not in offered:
            raise ValueError(f"congestion: expected one of the kernel's TCP congestion controls "
                             f"({', '.join(offered)}); got {name!r}")
        for ns, dev, addr in zip(self.ns, self.veth, self.addr):
            sh("ip", "-n", ns, "route", "replace", addr.rsplit(".", 1)[0] + ".0/24", "dev", dev, "proto", "kernel",
               "scope", "link", "src", addr, "congctl", name)
        return f"{name} (route congctl; the kernel's default: {default})"

    def tcp_segments(self) -> tuple:
        """``(sent, retransmitted)``: TCP segments every host's stack sent so far and those of
        them it retransmitted, all hosts together (``/proc/net/snmp`` of each namespace)."""
        sent = again = 0
        for ns in self.ns:
            rows = [ln.split() for ln in sh("ip", "netns", "exec", ns, "cat", "/proc/net/snmp").stdout.splitlines()
                    if ln.startswith("Tcp:")]
            row = dict(zip(rows[0][1:], rows[1][1:]))
            sent += int(row["OutSegs"])
            again += int(row["RetransSegs"])
        return sent, again

    def shape(self, delay: str | None, rate: str | None) -> str:
        """Delay and rate limit on every host's interface (egress): ``tc netem`` where the
        kernel has it, else only the rate, with ``tbf``. Returns what was applied."""
        spec = (["delay", delay] if delay else []) + (["rate", rate] if rate else [])
        if not spec:
            return "no shaping"
        for ns, dev in zip(self.ns, self.veth):
            r = sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "netem", *spec,
                   check=False)
            if r.returncode != 0:
                break
        else:
            return "netem " + " ".join(spec)
        if not rate:
            return f"no shaping (netem unavailable: {r.stderr.strip()})"
        for ns, dev in zip(self.ns, self.veth):
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
               "burst", "256kb", "latency", "100ms")
        return f"tbf rate {rate} (netem unavailable, no delay: {r.stderr.strip()})"


def _kill_and_delete(names) -> None:
    for n in names:
        pids = subprocess.run(["ip", "netns", "pids", n], capture_output=True, text=True).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), 9)
            except (OSError, ValueError):
                pass
        subprocess.run(["ip", "netns", "del", n], capture_output=True)


def namespaces() -> set:
    """The names ``ip netns list`` lists now."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {ln.split()[0] for ln in listed.splitlines() if ln.strip()}


def _skip_unless_netns(skip) -> None:
    """``skip(reason)`` (it must raise) without iproute2 or root, which namespaces need."""
    if shutil.which("ip") is None:
        skip("iproute2 ('ip') is not installed")
    if os.geteuid() != 0:
        skip("network namespaces need root")


def skip_unless_mpich_hosts(skip, *modules: str) -> None:
    """For the benchmarks that run MPICH on namespaces as hosts: ``skip(reason)`` (it must
    raise) without each of ``modules``, mpi4py with MPICH's mpiexec, iproute2 or root."""
    import importlib.util

    for name in modules:
        if importlib.util.find_spec(name) is None:
            skip(f"{name} not installed")
    # where ndist-bench looks for it (ndist.bench's find_mpiexec): beside the interpreter, else on PATH
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    if importlib.util.find_spec("mpi4py") is None or mpiexec is None:
        skip("mpi4py / MPICH's mpiexec not installed")
    _skip_unless_netns(skip)


@contextlib.contextmanager
def make_hosts(count: int, skip):
    """``count`` namespaces, linked; deleted (their processes killed) on exit.
    ``skip(reason)`` is called (it must raise) where namespaces cannot be made."""
    _skip_unless_netns(skip)
    tag = uuid.uuid4().hex[:6]
    hosts = Hosts(tag)
    made: list[str] = []
    try:
        for i in range(count):
            name = f"ndist-{tag}-{chr(ord('a') + i) if count <= 26 else i}"
            r = sh("ip", "netns", "add", name, check=False)
            if r.returncode != 0:
                skip(f"cannot create a network namespace (no CAP_NET_ADMIN?): {r.stderr.strip()}")
            made.append(name)
            hosts.ns.append(name)
            hosts.addr.append(f"10.77.0.{i + 1}")
        if count == 2:
            hosts.veth = [f"nd{tag}a", f"nd{tag}b"]
            sh("ip", "link", "add", hosts.veth[0], "netns", hosts.ns[0], "type", "veth", "peer", "name",
               hosts.veth[1], "netns", hosts.ns[1])
        else:
            hosts.switch = f"ndist-{tag}-sw"
            sh("ip", "netns", "add", hosts.switch)
            made.append(hosts.switch)
            br = f"br{tag}"
            sh("ip", "-n", hosts.switch, "link", "add", br, "type", "bridge")
            sh("ip", "-n", hosts.switch, "link", "set", br, "up")
            for i, ns in enumerate(hosts.ns):
                dev, port = f"nd{tag}{i}", f"nd{tag}p{i}"
                sh("ip", "link", "add", dev, "netns", ns, "type", "veth", "peer", "name", port, "netns", hosts.switch)
                sh("ip", "-n", hosts.switch, "link", "set", port, "master", br)
                sh("ip", "-n", hosts.switch, "link", "set", port, "up")
                hosts.veth.append(dev)
                hosts.ports.append(port)
        for ns, dev, addr in zip(hosts.ns, hosts.veth, hosts.addr):
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        hosts.wait_up()
        yield hosts
    finally:
        _kill_and_delete(made)


@contextlib.contextmanager
def inside(ns: str):
    """The calling thread inside network namespace ``ns`` (``setns``), back in its own on exit:
    a socket it makes meanwhile belongs to ``ns`` for good (``run_ranks`` hosts its store
    there, where every host reaches it). Other threads stay where they are."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(target, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"cannot enter network namespace {ns}: {os.strerror(err)}")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if libc.setns(own, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"cannot leave network namespace {ns}: {os.strerror(err)}")
    finally:
        os.close(own)


def free_port_in(ns: str, addr: str = "10.77.0.1") -> int:
    """A free port on ``addr`` in namespace ``ns`` (nobody else can bind there before the launch)."""
    code = f"import socket; s = socket.socket(); s.bind(({addr!r}, 0)); print(s.getsockname()[1])"
    return int(sh("ip", "netns", "exec", ns, sys.executable, "-c", code).stdout)


def ndist_env(**extra) -> dict:
    """The environment of a launcher: this checkout, a fresh job secret, no inherited rank variables."""
    env = dict(os.environ, PYTHONPATH=str(_IMPORT_ROOT), NDIST_SECRET=uuid.uuid4().hex)
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(k, None)
    env.update(extra)
    return env


_LAUNCH_EXTRA = ("--rdzv-timeout", "30", "--term-timeout", "5")


def node_commands(hosts: Hosts, nproc, argv: list[str], extra: tuple = _LAUNCH_EXTRA,
                  node_env: list | None = None) -> list[list[str]]:
    """The command of ``ndistrun --nnodes H`` for every namespace: node i in
    ``hosts.ns[i]`` with ``nproc`` ranks (or ``nproc[i]``), the store on a free port of
    node 0; ``node_env[i]``: variables for node i alone (``env`` inside the namespace).

    The "hosts" share this machine's CPUs, which ndistrun's CPU binding cannot know: when
    there is a CPU for every rank of every host, node i's launcher runs on CPUs of its own
    (``taskset``), as on a host of its own, and binds its ranks there; otherwise every node
    gets ``--bind-to none``, so that no two hosts bind their ranks to the same CPUs."""
    port = free_port_in(hosts.ns[0], hosts.addr[0])
    counts = [nproc] * len(hosts.ns) if isinstance(nproc, int) else list(nproc)
    slices = _cpu_slices(counts)
    cmds = []
    for node, ns in enumerate(hosts.ns):
        own = [f"{k}={v}" for k, v in (node_env[node] if node_env else {}).items()]
        place = ["taskset", "-c", ",".join(map(str, slices[node]))] if slices else []
        cmds.append(["ip", "netns", "exec", ns, *(["env", *own] if own else []), *place, sys.executable, "-m",
                     "ndist.launch", "--nnodes", str(len(hosts.ns)), "--node-rank", str(node), "--nproc-per-node",
                     str(counts[node]), "--master-addr", hosts.addr[0], "--master-port", str(port),
                     *([] if slices else ["--bind-to", "none"]), *extra, *argv])
    return cmds


def _cpu_slices(counts: list[int]) -> list[list[int]] | None:
    """Disjoint CPUs of this process's mask for each host's ranks, in host order; None when
    there are fewer CPUs than ranks in all, or no ``taskset`` to start a launcher on them."""
    cpus = sorted(os.sched_getaffinity(0))
    if sum(counts) > len(cpus) or shutil.which("taskset") is None:
        return None
    out, at = [], 0
    for n in counts:
        out.append(cpus[at:at + n])
        at += n
    return out


def launch_nodes(hosts: Hosts, nproc, argv: list[str], env: dict, logdir: Path, extra: tuple = _LAUNCH_EXTRA) -> list:
    """``ndistrun --nnodes H`` in every namespace (``node_commands``), output in
    ``logdir/node<i>.out|err`` (files, not pipes: nobody reads a pipe while we wait)."""
    procs = []
    for node, (ns, cmd) in enumerate(zip(hosts.ns, node_commands(hosts, nproc, argv, extra))):
        logs = (open(logdir / f"node{node}.out", "w"), open(logdir / f"node{node}.err", "w"))
        procs.append(subprocess.Popen(cmd, env=dict(env, NDIST_TEST_NODE=ns), stdout=logs[0], stderr=logs[1]))
        for f in logs:
            f.close()
    return procs


def wait_launchers(procs: list, seconds: float, late: str = "hang") -> list:
    """Wait for every launcher of ``launch_nodes`` within ``seconds`` in all; a launcher
    still running then is killed and counted as ``late``. Returns the exit codes."""
    deadline = time.monotonic() + seconds
    codes = []
    try:
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(late)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    return codes


def outputs(logdir: Path, count: int) -> list:
    """``(stdout, stderr)`` of every launcher of ``launch_nodes``."""
    return [((logdir / f"node{n}.out").read_text(), (logdir / f"node{n}.err").read_text()) for n in range(count)]
