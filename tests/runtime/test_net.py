import socket
import threading

import pytest

from ndist.runtime._net import AuthenticationError, client_handshake, recv_exact, send_all, server_handshake


def _pair_with_server(secret_server, secret_client):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    result = {}

    def serve():
        conn, _ = srv.accept()
        try:
            server_handshake(conn, secret_server, timeout=5)
            result["server"] = "ok"
            send_all(conn, b"hello", memoryview(b" world"))
        except AuthenticationError as err:
            result["server"] = err
        finally:
            conn.close()

    t = threading.Thread(target=serve)
    t.start()
    cli = socket.create_connection(srv.getsockname())
    try:
        client_handshake(cli, secret_client, timeout=5)
        result["client"] = recv_exact(cli, 11)
    except AuthenticationError as err:
        result["client"] = err
    finally:
        cli.close()
        t.join(5)
        srv.close()
    return result


def test_handshake_with_same_secret_then_data_flows():
    r = _pair_with_server(b"s3cret", b"s3cret")
    assert r == {"server": "ok", "client": b"hello world"}


def test_wrong_secret_is_refused_on_both_sides():
    r = _pair_with_server(b"s3cret", b"wrong")
    assert isinstance(r["server"], AuthenticationError)
    assert "job-secret" in str(r["server"])
    assert isinstance(r["client"], AuthenticationError)
    assert "NDIST_SECRET" in str(r["client"])
