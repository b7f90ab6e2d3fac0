"""Key-value stores for rendezvous: HashStore (in process), TCPStore, FileStore, PrefixStore."""

from ._base import DEFAULT_TIMEOUT, Store
from ._hash import HashStore

__all__ = ["Store", "HashStore", "DEFAULT_TIMEOUT"]
