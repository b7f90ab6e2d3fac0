"""ndist.futures: torch.futures' API (``Future``, ``collect_all``, ``wait_all``).

``Work.get_future()`` returns an ``ndist.futures.Future``: torch's ``wait``,
``value``, ``then``, ``done``, ``set_result``, ``set_exception``,
``add_done_callback``, and, since it is a ``concurrent.futures.Future``, the
stdlib's ``result`` and ``exception``.
"""

from .runtime._future import Future, collect_all, wait_all

__all__ = ["Future", "collect_all", "wait_all"]
