"""ndist.testing.run_ranks on several hosts (``hosts=``): network namespaces of ``make_hosts``,
``ndistrun --nnodes H`` in each, ranks numbered host by host, every launcher's exit status;
and its arguments refused before anything starts. The runs need root (``make_hosts`` skips
without it); the argument checks do not."""

import os

import numpy as np
import pytest

from ndist.testing import Hosts, RankFailedError, make_hosts, run_ranks


def _where(rank, world_size):
    import ndist.distributed as dist

    x = np.array([rank + 1.0])
    dist.all_reduce(x)
    return rank, world_size, float(x[0]), os.stat("/proc/self/ns/net").st_ino


def _raise_on_rank_2(rank, world_size):
    if rank == 2:
        raise KeyError("rank two's own error")
    return rank


@pytest.mark.timeout(120)
def test_ranks_run_host_by_host_in_the_namespaces():
    with make_hosts(2, pytest.skip) as hosts:
        inode = [os.stat(f"/var/run/netns/{ns}").st_ino for ns in hosts.ns]
        out = run_ranks(_where, 3, hosts=hosts, per_host=[1, 2], timeout=60)
        assert out == [(0, 3, 6.0, inode[0]), (1, 3, 6.0, inode[1]), (2, 3, 6.0, inode[1])]
        assert out.launcher_exitcodes == [0, 0] and out.launcher_exitcode == 0 and out.shm_left == []
        with pytest.raises(RankFailedError) as info:
            run_ranks(_raise_on_rank_2, 4, hosts=hosts, init=False, timeout=60)
        assert info.value.rank == 2 and "KeyError" in str(info.value)


def _hosts(count):
    hosts = Hosts("test")
    hosts.ns = [f"ndist-test-{i}" for i in range(count)]
    hosts.addr = [f"10.77.0.{i + 1}" for i in range(count)]
    return hosts


@pytest.mark.parametrize("kw, error, words", [
    (dict(hosts=["ns-a", "ns-b"]), TypeError, ["hosts", "Hosts of ndist.testing.make_hosts", "list"]),
    (dict(hosts=_hosts(0)), ValueError, ["hosts", "at least one namespace", "[]"]),
    (dict(hosts=_hosts(3)), ValueError, ["world_size", "multiple of the 3 hosts", "4"]),
    (dict(hosts=_hosts(2), per_host=[1, 2]), ValueError, ["per_host", "2 positive ints summing to world_size 4",
                                                           "[1, 2]"]),
    (dict(hosts=_hosts(2), per_host=[4, 0]), ValueError, ["per_host", "positive ints", "[4, 0]"]),
    (dict(hosts=_hosts(2), per_host=4), TypeError, ["per_host", "sequence of ints", "int"]),
    (dict(per_host=[2, 2]), ValueError, ["per_host", "None without hosts", "[2, 2]"]),
    (dict(hosts=_hosts(2), launcher="mpiexec"), ValueError, ["launcher", "'ndistrun'", "'mpiexec'"]),
])
def test_bad_hosts_arguments_are_refused_before_anything_starts(kw, error, words):
    with pytest.raises(error) as info:
        run_ranks(_where, 4, **kw)
    assert all(w in str(info.value) for w in words), str(info.value)


def _connected_pair(hosts):
    """A TCP connection from host 0 to host 1: (client, server side), made inside their namespaces."""
    import socket

    from ndist._testing._netns import inside

    with inside(hosts.ns[1]):
        listener = socket.create_server((hosts.addr[1], 0))
    with inside(hosts.ns[0]):
        client = socket.create_connection((hosts.addr[1], listener.getsockname()[1]), timeout=10)
    server, _ = listener.accept()
    listener.close()
    return client, server


def _congestion_of(sock) -> str:
    import socket

    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


@pytest.mark.timeout(60)
def test_congestion_control_between_hosts_is_set_on_their_routes_and_segments_are_counted():
    offered = open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split()
    with make_hosts(2, pytest.skip) as hosts:
        default = hosts.congestion(None)
        client, server = _connected_pair(hosts)
        with client, server:
            used = _congestion_of(client)
        assert default == f"{used} (the kernel's default)"
        # one the namespaces' own default may not be (tcp_allowed_congestion_control) works on the routes
        other = next(x for x in ("reno", "cubic", "bbr") if x in offered and x != used)
        assert hosts.congestion(other).startswith(f"{other} (route congctl")
        sent, again = hosts.tcp_segments()
        client, server = _connected_pair(hosts)
        with client, server:
            assert _congestion_of(client) == _congestion_of(server) == other
            import threading

            sender = threading.Thread(target=client.sendall, args=(b"x" * (1 << 20),), daemon=True)
            sender.start()
            got = 0
            while got < 1 << 20:
                got += len(server.recv(1 << 20))
            sender.join(10)
        sent2, again2 = hosts.tcp_segments()
        assert sent2 - sent >= (1 << 20) // 65536 and again2 >= again  # (GSO: up to 64 KiB a segment)
        with pytest.raises(ValueError) as info:
            hosts.congestion("no-such-cc")
        assert "congestion" in str(info.value) and "no-such-cc" in str(info.value) and offered[0] in str(info.value)
