"""TCPStore across real processes: concurrency, authentication, failures."""

import logging
import multiprocessing as mp
import os
import signal
import socket
import struct
import threading
import time

import pytest

from ndist.runtime import DistNetworkError, DistStoreError, DistTimeoutError, TCPStore, TCPStoreServer
from ndist.runtime._net import client_handshake

SECRET = "tcp-store-test-secret"
ctx = mp.get_context("spawn")


def _client_main(port, rank, world_size, q):
    try:
        s = TCPStore("127.0.0.1", port, timeout=30, secret=SECRET)
        s.set(f"rank/{rank}", str(os.getpid()))
        n = s.add("joined", 1)
        s.wait([f"rank/{r}" for r in range(world_size)])
        q.put((rank, n, s.get(f"rank/{(rank + 1) % world_size}")))
        s.close()
    except BaseException as err:  # report instead of dying silently
        q.put((rank, "error", repr(err)))


@pytest.mark.timeout(120)
def test_processes_rendezvous_through_the_master():
    world = 4
    master = TCPStore(
        "127.0.0.1", 0, world_size=world + 1, is_master=True, wait_for_workers=False, timeout=60, secret=SECRET
    )
    q = ctx.Queue()
    procs = [ctx.Process(target=_client_main, args=(master.port, r, world, q)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        master._wait_workers(world + 1)  # what wait_for_workers=True does once the port is known
        assert master.server.num_workers == world + 1
        results = sorted(q.get(timeout=90) for _ in range(world))
    finally:
        for p in procs:
            p.join(30)
        master.close()
    assert all(r[1] != "error" for r in results), results
    assert sorted(r[1] for r in results) == [1, 2, 3, 4]
    pids = {p.pid for p in procs}
    assert all(int(r[2]) in pids for r in results)


@pytest.mark.timeout(120)
def test_64_clients_wait_concurrently_without_blocking_each_other():
    n = 64
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=60, secret=SECRET) as master:
        clients = [TCPStore("127.0.0.1", master.port, timeout=60, secret=SECRET) for _ in range(n)]
        errors, done = [], []

        def worker(i):
            try:
                # every client blocks on the key the next one sets: all waits are pending at once
                clients[i].set(f"k{i}", str(i))
                clients[i].wait([f"k{(i + 1) % n}"])
                done.append(clients[i].get(f"k{(i + 1) % n}"))
            except Exception as err:  # noqa: BLE001
                errors.append(err)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(90)
        assert not errors
        assert sorted(int(x) for x in done) == list(range(n))
        assert master.server.num_workers == n + 1
        for c in clients:
            c.close()


@pytest.mark.timeout(60)
def test_threads_of_one_process_do_not_deadlock_on_the_shared_connection():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=20, secret=SECRET) as s:
        # thread A blocks in wait on the store; thread B must still be able to set the key
        t = threading.Timer(0.2, s.set, args=("go", "1"))
        t.start()
        s.wait(["go"])
        t.join()
        assert s.get("go") == b"1"


@pytest.mark.timeout(60)
def test_wrong_secret_is_refused_and_never_reaches_the_keys(caplog):
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=10, secret=SECRET) as master:
        before = master.num_keys()
        with caplog.at_level(logging.WARNING, logger="ndist.runtime.store"):
            with pytest.raises(DistStoreError, match="NDIST_SECRET"):
                TCPStore("127.0.0.1", master.port, timeout=5, secret="not-the-secret")
            deadline = time.monotonic() + 10
            while "refused a client" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.01)
        assert "refused a client" in caplog.text
        assert master.num_keys() == before
        assert master.server.num_workers == 1


@pytest.mark.timeout(60)
def test_raw_socket_without_handshake_cannot_write_keys():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=10, secret=SECRET) as master:
        raw = socket.create_connection(("127.0.0.1", master.port))
        raw.settimeout(10)
        raw.recv(40)  # the server's challenge
        # answer with garbage that contains a SET frame
        raw.sendall(b"\0" * 72 + struct.pack("!I", 12) + b"\x01" + struct.pack("!I", 1) + b"k" + struct.pack("!I", 2) + b"vv")
        try:
            reply = raw.recv(64)
        except ConnectionResetError:
            reply = b""
        assert reply in (b"\0" * 32, b"")
        raw.close()
        assert not master.check(["k"])
        master.set("after", "ok")  # server still serves authenticated clients
        assert master.get("after") == b"ok"


@pytest.mark.timeout(60)
def test_forged_frame_length_closes_the_connection_without_allocating():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=10, secret=SECRET) as master:
        raw = socket.create_connection(("127.0.0.1", master.port))
        raw.settimeout(10)
        client_handshake(raw, SECRET.encode())
        raw.sendall(struct.pack("!I", 0xFFFFFFF0))
        assert raw.recv(16) == b""  # dropped
        raw.close()
        master.set("still", "alive")
        assert master.get("still") == b"alive"


def _host_server(q, secret):
    srv = TCPStoreServer("127.0.0.1", 0, secret)
    q.put(srv.port)
    time.sleep(600)


@pytest.mark.timeout(60)
def test_server_death_fails_clients_promptly_instead_of_hanging():
    q = ctx.Queue()
    p = ctx.Process(target=_host_server, args=(q, SECRET))
    p.start()
    try:
        port = q.get(timeout=30)
        client = TCPStore("127.0.0.1", port, timeout=30, secret=SECRET)
        client.set("a", "1")
        waiter_err = []

        def waiter():
            c2 = TCPStore("127.0.0.1", port, timeout=30, secret=SECRET)
            try:
                c2.wait(["never"])
            except Exception as err:  # noqa: BLE001
                waiter_err.append(err)

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.3)
        os.kill(p.pid, signal.SIGKILL)
        t0 = time.monotonic()
        t.join(20)
        assert waiter_err and isinstance(waiter_err[0], DistStoreError)
        assert f"store server at 127.0.0.1:{port} closed the connection" in str(waiter_err[0])
        with pytest.raises((DistStoreError, DistNetworkError, DistTimeoutError)):
            client.get("a")
        # later calls fail at once too (no reconnect attempts for the store's 30 s timeout)
        t1 = time.monotonic()
        with pytest.raises(DistStoreError, match=f"127.0.0.1:{port}"):
            client.set("b", "2")
        with pytest.raises(DistStoreError, match=f"127.0.0.1:{port}"):
            client.check(["a"])
        assert time.monotonic() - t1 < 15
        assert time.monotonic() - t0 < 20
    finally:
        p.kill()
        p.join(10)


@pytest.mark.timeout(60)
def test_master_close_wakes_waiting_clients():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=30, secret=SECRET)
    client = TCPStore("127.0.0.1", master.port, timeout=30, secret=SECRET)
    threading.Timer(0.2, master.close).start()
    with pytest.raises(DistStoreError, match="closed the connection"):
        client.wait(["never"])


@pytest.mark.timeout(60)
def test_port_in_use_is_a_clear_error_naming_it():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        with pytest.raises(DistNetworkError, match=f"127.0.0.1:{port}.*already in use"):
            TCPStore("127.0.0.1", port, is_master=True, timeout=5, secret=SECRET)
    finally:
        busy.close()


@pytest.mark.timeout(60)
def test_master_wait_for_workers_times_out_saying_how_many_joined():
    with pytest.raises(DistTimeoutError, match="1 of 3 workers"):
        TCPStore("127.0.0.1", 0, world_size=3, is_master=True, timeout=0.5, secret=SECRET)


@pytest.mark.timeout(60)
def test_client_without_server_fails_by_its_timeout():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    t0 = time.monotonic()
    with pytest.raises((DistNetworkError, DistTimeoutError), match=str(port)):
        TCPStore("127.0.0.1", port, timeout=0.5, secret=SECRET)
    assert time.monotonic() - t0 < 15


def test_argument_checks():
    with pytest.raises(ValueError, match="port"):
        TCPStore("127.0.0.1", -1, is_master=True)
    with pytest.raises(ValueError, match="port"):
        TCPStore("127.0.0.1", 0, is_master=False)
    with pytest.raises(ValueError, match="world_size"):
        TCPStore("127.0.0.1", 0, world_size=0, is_master=True)
    with pytest.raises(ValueError, match="host_name"):
        TCPStore("", 1234)


@pytest.mark.timeout(60)
def test_large_value_roundtrip():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=30, secret=SECRET) as s:
        big = os.urandom(8 << 20)
        s.set("big", big)
        assert s.get("big") == big


def _late_user(port, q):
    s = TCPStore("127.0.0.1", port, timeout=30, secret=SECRET)
    q.put("connected")
    s.wait(["bye"])
    time.sleep(0.5)  # still using the store after the master began to shut down
    s.set("child-done", "1")
    q.put(s.get("child-done").decode())
    s.close()


@pytest.mark.timeout(60)
def test_master_shutdown_waits_for_other_processes_but_not_for_its_own_clients():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=30, secret=SECRET)
    same_process = TCPStore("127.0.0.1", master.port, timeout=30, secret=SECRET)  # left open
    q = ctx.Queue()
    p = ctx.Process(target=_late_user, args=(master.port, q))
    p.start()
    try:
        assert q.get(timeout=30) == "connected"
        assert len(master.server.connected_clients()) == 3
        master.set("bye", "1")
        master.shutdown(grace=30)  # returns once the child disconnected
        assert q.get(timeout=30) == "1"  # the child finished its work on the store
        with pytest.raises(DistStoreError):
            same_process.get("bye")
    finally:
        p.join(30)
    assert p.exitcode == 0
