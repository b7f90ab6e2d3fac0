"""Test modules are imported by basename (no packages under tests/): two files with one
name make the full run fail at collection, though each folder passes alone."""

import collections
import pathlib


def test_every_test_module_has_a_unique_basename():
    names = collections.defaultdict(list)
    for path in pathlib.Path(__file__).resolve().parent.rglob("test_*.py"):
        names[path.name].append(str(path))
    assert not {n: p for n, p in names.items() if len(p) > 1}
