"""Collective schedules: what each rank sends, receives and reduces, round by round
(`_schedule`, two-level ones in `_twolevel`), their execution on the engine (`_run`), the
simulator that checks them (`_simulate`), and the reduction kernels (`_reduce`).
"""
