"""Collective schedules: what each rank sends, receives and reduces, round by round
(`_schedule`, two-level ones in `_twolevel`), the simulator that checks them (`_simulate`),
and the reduction kernels (`_reduce`). The Python engine runs them (`engine/_scheduled`), the
native engine too (`native/`).
"""
