"""Key-value stores for rendezvous: HashStore (in process), TCPStore, FileStore, PrefixStore."""

from ._base import DEFAULT_TIMEOUT, Store
from ._file import FileStore
from ._hash import HashStore
from ._prefix import PrefixStore
from ._tcp import TCPStore
from ._tcp_server import TCPStoreServer

__all__ = ["Store", "HashStore", "TCPStore", "TCPStoreServer", "FileStore", "PrefixStore", "DEFAULT_TIMEOUT"]
