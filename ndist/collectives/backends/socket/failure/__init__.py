"""Failure of the socket backend, in one place: lost peers (`_losses` for the process,
`_engine_loss` for the collective engine, `_p2p_loss` for point-to-point) and stalls
(`_stalls` for the process, `_engine_stall`, `_p2p_stall`).
"""
