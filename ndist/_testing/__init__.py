"""The machinery behind ``ndist.testing``: run a function on N ranks in fresh
processes (``_run``), each started as ``python -m ndist._testing._rank_main``.

A top layer, beside the facades: a rank's bootstrap imports ``ndist.distributed``
(so the built-in backends are registered before ``init_process_group``)."""
