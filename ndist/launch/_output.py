"""Forwarding a rank's stdout / stderr: prefixing, tee to a log file, partial lines.

A ``StreamPump`` owns the read end of one pipe. Bytes are forwarded as they
come, whole lines at a time, each line prefixed (``[rank3]:``), to the
launcher's own stdout or stderr (the stream the rank wrote to: the two are
never mixed), and copied unchanged to a log file when teeing. A partial line
is held until its newline, or written with a newline added when the pipe
closes or the job ends, so lines from different ranks never interleave.
Bytes are passed through undecoded.
"""

from __future__ import annotations

import errno
import os

__all__ = ["StreamPump", "format_prefix"]

_READ = 1 << 16
_MAX_PARTIAL = 1 << 16  # a "line" longer than this is forwarded in pieces


def format_prefix(template: str, rank: int, local_rank: int, role: str = "default") -> bytes:
    """Expand ``--log-line-prefix-template`` (``${rank}``, ``${local_rank}``, ``${role_name}``)."""
    from string import Template

    return Template(template).safe_substitute(rank=rank, local_rank=local_rank, role_name=role).encode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:  # pragma: no cover - PEP 475 retries already
            continue
        except BlockingIOError:
            # Our stdout is non-blocking (shared with another process): wait for room.
            import select

            select.select([], [fd], [])
            continue
        view = view[n:]


class StreamPump:
    """Forward one rank stream read from ``fd`` to ``console_fd`` and/or ``log_file``."""

    __slots__ = ("fd", "console_fd", "prefix", "log_file", "_partial", "closed", "_console_ok")

    def __init__(self, fd: int, console_fd: int | None, prefix: bytes, log_file=None) -> None:
        self.fd = fd
        self.console_fd = console_fd
        self.prefix = prefix
        self.log_file = log_file  # a binary file object, or None
        self._partial = b""
        self.closed = False
        self._console_ok = console_fd is not None
        os.set_blocking(fd, False)

    def read_available(self) -> bool:
        """Read and forward what the pipe holds now. False once it reached EOF (or is closed)."""
        while not self.closed:
            try:
                data = os.read(self.fd, _READ)
            except BlockingIOError:
                return True
            except OSError as err:
                if err.errno == errno.EINTR:  # pragma: no cover
                    continue
                data = b""
            if not data:
                return False
            self._forward(data)
        return False

    def _forward(self, data: bytes) -> None:
        if self.log_file is not None:
            self.log_file.write(data)
            self.log_file.flush()
        if not self._console_ok:
            return
        data = self._partial + data
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) < _MAX_PARTIAL:
            self._partial = data
            return
        if cut == 0:
            cut = len(data)
            data = data + b"\n"
            self._partial = b""
            self._emit(data)
            return
        self._partial = data[cut:]
        self._emit(data[:cut])

    def _emit(self, lines: bytes) -> None:
        # ``lines`` ends with b"\n": prefix every line in one write.
        p = self.prefix
        if p:
            lines = p + lines[:-1].replace(b"\n", b"\n" + p) + b"\n"
        try:
            _write_all(self.console_fd, lines)
        except BrokenPipeError:
            self._console_ok = False  # nobody reads our output any more: keep draining the rank
        except OSError as err:
            if err.errno != errno.EPIPE:
                raise
            self._console_ok = False

    def flush_partial(self) -> None:
        """Forward a held partial line, with a newline added."""
        if self._partial and self._console_ok:
            data, self._partial = self._partial, b""
            self._emit(data + b"\n")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.flush_partial()
        os.close(self.fd)
        if self.log_file is not None:
            self.log_file.close()
