"""The Python progress engine of the socket backend: non-blocking streams per peer
(`_engine`), frames in and out (`_frame_io`), links opened on first use (`_conns`), and the
collective algorithms written against it (`_algorithms`).
"""
