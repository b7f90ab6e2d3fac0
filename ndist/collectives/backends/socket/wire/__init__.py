"""The wire: how bytes travel between two ranks of the socket backend.

The TCP / Unix-socket mesh and its acceptor (`_tcp`, `_accept`), the frame header
(`_frame`), what a link's two ends agree on when it opens (`_link_facts`), the per-peer
transport decisions (`_links`), and the three same-host mechanisms: shared-memory
*segments* (`_segment`), byte *rings* (`_ring`) and cross-memory attach (`_cma`).
"""
