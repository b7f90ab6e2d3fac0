"""Point-to-point messages of the socket backend: the side (`_p2p`) and its streams
(`_stream`).
"""
