"""torchft's reconfigurable process group on backend "ndist".

``from ndist.torch.torchft import ProcessGroupNdistFT`` is what torchft's own
``torchft.process_group.ProcessGroupGloo`` is for Gloo: pass it to
``torchft.Manager(pg=...)`` and every quorum change (``configure``) aborts the
previous group and builds a new one over the quorum's store, through the public
``ndist.torch.make_process_group`` (no torch private options). This module imports
torchft; ``ndist.torch`` does not. docs/torch.md, "torchft".
"""

from __future__ import annotations

from datetime import timedelta

from torchft.process_group import ProcessGroupWrapper

from ._backend import Options
from ._standalone import make_process_group

__all__ = ["ProcessGroupNdistFT"]


class ProcessGroupNdistFT(ProcessGroupWrapper):
    """A torchft ``ProcessGroup`` whose groups are backend-"ndist" groups.

    ``timeout``: the store's and every op's (torchft's ``set_timeout`` changes it for
    the next ``configure``); ``options``: ``ndist.torch.Options`` for each group.
    """

    def __init__(self, timeout: timedelta = timedelta(seconds=60), options: Options | None = None) -> None:
        if options is not None and not isinstance(options, Options):
            raise TypeError(f"options: expected ndist.torch.Options or None, got {type(options).__name__}")
        super().__init__(timeout=timeout)
        self._nd_options = options

    def _create_pg(self, store, rank: int, world_size: int):
        # the same name on every member of this quorum's group (its store is the quorum's own)
        name = "torchft" if self._quorum_id is None else f"torchft-q{self._quorum_id}"
        return make_process_group(store, rank, world_size, self._timeout, options=self._nd_options,
                                  group_name=name)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return "torchft-ndist"

    def shutdown(self) -> None:
        """Close the current group (torchft's own ``shutdown`` only drops it)."""
        pg = self._pg
        super().shutdown()
        if pg is not None:
            pg.shutdown()
