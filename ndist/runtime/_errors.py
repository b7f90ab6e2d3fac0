"""The one error tree of ndist.

Every failure that crosses a process boundary is one of these. Argument
problems are plain ``ValueError`` / ``TypeError`` raised before any
communication; these classes are for what happens during it.
"""

from __future__ import annotations

__all__ = [
    "DistError",
    "DistBackendError",
    "DistNetworkError",
    "DistStoreError",
    "DistTimeoutError",
    "DistMismatchError",
    "DistCaptureError",
    "DistAuthenticationError",
    "DistRankFailureError",
    "QueueEmptyError",
]


class DistError(RuntimeError):
    """Base class of every ndist runtime error."""


class DistBackendError(DistError):
    """A backend failed to carry out an operation (MPI error, NCCL error, ...)."""


class DistNetworkError(DistError):
    """A connection to a peer was lost or could not be made.

    ``rank`` is the peer's rank in the group the operation ran on (``None``
    when it is not known, e.g. the store server), ``host`` its host name or
    address.
    """

    def __init__(self, message: str, *, rank: int | None = None, host: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.host = host

    def __reduce__(self):
        return (_rebuild_network_error, (str(self), self.rank, self.host))


def _rebuild_network_error(message, rank, host):
    return DistNetworkError(message, rank=rank, host=host)


class DistAuthenticationError(DistNetworkError):
    """The handshake that starts every connection failed on the job secret: the peer
    (``rank`` / ``host`` when known) answered with another secret, or is not an ndist
    process. The message says the secret did not match."""

    def __reduce__(self):
        return (_rebuild_authentication_error, (str(self), self.rank, self.host))


def _rebuild_authentication_error(message, rank, host):
    return DistAuthenticationError(message, rank=rank, host=host)


#: how a member was lost: ``DistRankFailureError.causes`` (the member watch tells them)
DIED, EXITED, LEFT = "died", "exited", "left"


class DistRankFailureError(DistNetworkError):
    """A group lost members: they died, or exited while the group still needed them.

    ``failed_ranks`` are the lost members' ranks in the group the operation ran on
    (sorted), ``hosts`` their host names in the same order, ``causes`` how each was lost
    (``"died"``, ``"exited"``, ``"left"``: it destroyed its process group). ``rank`` /
    ``host`` (of ``DistNetworkError``) name the first lost member by global rank, as
    every other network error does. Once a group knows of a loss, every pending and
    later operation on it raises this error (the group is revoked) until it is shrunk
    (``shrink_group``) or destroyed.
    """

    def __init__(self, message: str, *, failed_ranks=(), hosts=(), causes=(), rank: int | None = None,
                 host: str | None = None):
        super().__init__(message, rank=rank, host=host)
        self.failed_ranks = list(failed_ranks)
        self.hosts = list(hosts)
        self.causes = list(causes)

    def __reduce__(self):
        return (_rebuild_rank_failure_error, (str(self), self.failed_ranks, self.hosts, self.causes, self.rank,
                                              self.host))


def _rebuild_rank_failure_error(message, failed_ranks, hosts, causes, rank, host):
    return DistRankFailureError(message, failed_ranks=failed_ranks, hosts=hosts, causes=causes, rank=rank, host=host)


class DistStoreError(DistError):
    """The key-value store refused or failed a request."""


class DistTimeoutError(DistError, TimeoutError):
    """An operation did not complete within its timeout.

    The message names what was waited on (keys, op and sequence number, the
    ranks not heard from).
    """


class DistMismatchError(DistBackendError):
    """Ranks called different collectives, or the same one with incompatible
    arguments (dtype, count, root). The message names both ranks and both calls."""


class DistCaptureError(DistBackendError):
    """An operation or a wait that a CUDA graph cannot record was asked for while
    the stream was being captured (a host-staged op, a host wait). The message
    names the op and why (``ndist.collectives._capture`` has the rules)."""


class QueueEmptyError(DistStoreError):
    """torch's error for popping an empty store queue. ndist's stores have no
    queues (``queue_push`` / ``queue_pop``), so nothing raises it yet; it exists so
    that ported ``except QueueEmptyError`` clauses resolve."""


# Tracebacks, reprs and pickles name the errors where users import them from, as torch's
# ``torch.distributed.DistBackendError`` does, not this private module.
for _cls in (DistError, DistBackendError, DistNetworkError, DistStoreError, DistTimeoutError, DistMismatchError,
             DistCaptureError, DistAuthenticationError, DistRankFailureError, QueueEmptyError):
    _cls.__module__ = "ndist.distributed"
del _cls
