"""The Python progress engine of the socket backend: ``CollectiveStreams`` (``_engine``: non-blocking
streams per peer, links opened on first use, frames in and out), and the collective
algorithms written against it (``_algorithms``), and the player of ``schedules/``' schedules
on it (``_scheduled``). What it does on a loss or a stall is
in ``failure/``.
"""
