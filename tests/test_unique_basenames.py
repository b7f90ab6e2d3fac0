"""Test modules are imported by basename (no packages under tests/): two files with one
name make the full run fail at collection, though each folder passes alone."""

import collections
import pathlib


def test_every_test_module_has_a_unique_basename():
    names = collections.defaultdict(list)
    for path in pathlib.Path(__file__).resolve().parent.rglob("test_*.py"):
        names[path.name].append(str(path))
    assert not {n: p for n, p in names.items() if len(p) > 1}


def test_no_test_folder_shadows_a_package():
    """tests/ is on sys.path: a folder named ``torch`` there is a namespace package that
    ``import torch`` finds where torch is not installed (``importorskip`` then passes and
    the test module fails at collection)."""
    here = pathlib.Path(__file__).resolve().parent
    shadowing = {"torch", "numpy", "mpi4py", "cupy", "ml_dtypes", "cloudpickle", "ndist", "pytest"}
    assert not [p.name for p in here.iterdir() if p.is_dir() and p.name in shadowing]
