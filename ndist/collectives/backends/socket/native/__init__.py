"""The native same-host engine: its Python side (`_engine`) and its C sources
(`cnative.c`, `kernels.h`, `cma.h`, built by setup.py into `_cnative`).
"""
