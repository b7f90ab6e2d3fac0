import socket
import threading

import pytest

from ndist.runtime._net import AuthenticationError, client_handshake, recv_exact, send_all, server_handshake
from tests.fresh_python import prints


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


@pytest.mark.timeout(60)
def test_connect_by_name_does_not_load_the_idna_codec():
    # getaddrinfo on a str host imports encodings.idna (+ stringprep, unicodedata), a few
    # milliseconds of every rank's start-up; connect passes an ASCII name as bytes.
    code = (
        "import socket, sys, time\n"
        "from ndist.runtime._net import connect\n"
        "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(1)\n"
        "sock = connect('localhost', srv.getsockname()[1], time.monotonic() + 20, 'test server')\n"
        "peer, _ = srv.accept()\n"
        "sock.sendall(b'x'); assert peer.recv(1) == b'x'\n"
        "assert 'encodings.idna' not in sys.modules, 'idna codec loaded'\n"
        "print('ok')\n"
    )
    assert prints(code, timeout=50) == "ok"
