"""Every public callable and class of torch.distributed exists in ndist.distributed,
or is on the exclusion list of docs/api.md ("Names of torch.distributed that ndist
leaves out") with a reason. Runs only where torch is installed (marker ``torch``)."""

from __future__ import annotations

import inspect
import os
import re
import types
import warnings

import pytest

torch_dist = pytest.importorskip("torch.distributed")

pytestmark = [pytest.mark.torch, pytest.mark.every_torch_release]

API_MD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "api.md")
HEADING = "### Names of torch.distributed that ndist leaves out"


def excluded_names(text: str) -> dict[str, str]:
    """``{name: reason}`` from the table rows (``| `Name`, `Other` | reason |``) of the section."""
    start = text.index(HEADING)
    end = text.find("\n#", start + len(HEADING))
    section = text[start:end if end != -1 else len(text)]
    found = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= {"-", " "}:
            continue
        for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cells[0]):
            found[name] = cells[1]
    return found


def torch_public_names() -> list[str]:
    names = []
    for name in dir(torch_dist):
        if name.startswith("_"):
            continue
        with warnings.catch_warnings():  # reduce_op warns that it is deprecated
            warnings.simplefilter("ignore", FutureWarning)
            obj = getattr(torch_dist, name)
            if not inspect.isclass(obj) and not callable(obj):
                continue
        if isinstance(obj, types.ModuleType):
            continue
        if not (getattr(obj, "__module__", None) or "torch").startswith("torch"):
            continue  # re-exported from the stdlib (timedelta)
        names.append(name)
    return names


def _api_text() -> str:
    with open(API_MD, encoding="utf-8") as f:
        return f.read()


def test_every_torch_distributed_name_is_in_ndist_or_excluded_with_a_reason():
    import ndist.distributed as nd

    excluded = excluded_names(_api_text())
    missing = [n for n in torch_public_names() if not hasattr(nd, n) and n not in excluded]
    assert not missing, (f"torch.distributed names missing from ndist.distributed and not excluded in "
                         f"docs/api.md: {missing}")
    assert all(len(reason) > 10 for reason in excluded.values()), excluded


def absent_by_design(reason: str, release: tuple[int, int], cuda: bool) -> bool:
    """Whether a row's reason says its names are not in every supported torch (CI runs two):
    "added in torch X.Y" where the installed release is older, or "only in CUDA builds"
    where torch is a CPU build."""
    added = re.search(r"added in torch (\d+)\.(\d+)", reason)
    if added and release < (int(added.group(1)), int(added.group(2))):
        return True
    return "only in CUDA builds" in reason and not cuda


def test_exclusion_list_is_not_stale():
    import torch

    import ndist.distributed as nd

    torch_names = set(torch_public_names())
    excluded = excluded_names(_api_text())
    assert len(excluded) >= 10, "the exclusion table of docs/api.md was not found"
    release = tuple(int(p) for p in torch.__version__.split(".")[:2])
    stale = sorted(n for n, why in excluded.items() if hasattr(nd, n) or (
        n not in torch_names and not absent_by_design(why, release, torch.version.cuda is not None)))
    assert not stale, f"docs/api.md excludes names that torch lacks or ndist has: {stale}"


def test_a_name_of_another_release_or_build_is_absent_by_design():
    assert absent_by_design("added in torch 2.14; ...", (2, 13), cuda=False)
    assert not absent_by_design("added in torch 2.14; ...", (2, 14), cuda=False)
    assert absent_by_design("present only in CUDA builds of torch", (2, 14), cuda=False)
    assert not absent_by_design("present only in CUDA builds of torch", (2, 14), cuda=True)
    assert not absent_by_design("a reason here", (2, 13), cuda=False)


def test_parser_reads_the_table():
    text = f"{HEADING}\n\n| name | why |\n|---|---|\n| `A`, `B` | a reason here |\n\n## next\n| `C` | no |\n"
    assert excluded_names(text) == {"A": "a reason here", "B": "a reason here"}
