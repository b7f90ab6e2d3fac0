"""The user docs cannot silently rot.

* every public name of ``ndist.distributed``, ``ndist.cuda`` and the
  non-stdlib additions of ``ndist.multiprocessing`` is documented in
  ``docs/api.md`` (a code span that starts with the name: ``name`` or
  ``name(...)``);
* a signature written in a heading (``#### `name(a, b=1)` ``) lists the
  function's real parameters, in order;
* every environment variable the code reads is in the table of
  ``docs/troubleshooting.md``;
* ``docs/README.md`` indexes every file of ``docs/``;
* a page that tells users to run ``mpiexec`` names the ``[mpi]`` extra that
  brings it (``pip install -e .`` alone has no MPI);
* every file the contributors' maps (``docs/architecture.md``, ``docs/socket.md``) name
  in a code span exists, and every link from one page to a section finds that section.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
_SPAN = re.compile(r"`([^`\n]+)`")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _read(name: str) -> str:
    with open(os.path.join(DOCS, name), encoding="utf-8") as f:
        return f.read()


def documented_names(text: str) -> set[str]:
    """Names a code span starts with: `all_reduce`, `all_reduce(tensor, ...)`, `Work.wait`."""
    names = set()
    for span in _SPAN.findall(text):
        m = _NAME.match(span.strip())
        if m:
            names.add(m.group(0))
    return names


def _param_names(text: str) -> list[str]:
    """``"a, b=(1, 2), c=f(x)"`` -> ``["a", "b", "c"]`` (commas inside brackets do not split)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.split("=")[0].strip() for p in parts if p.strip()]


def heading_signatures(text: str) -> list[tuple[str, list[str]]]:
    """``(name, [parameter names])`` for each ``name(params)`` code span in a heading."""
    found = []
    for line in text.splitlines():
        if not line.startswith("#"):
            continue
        for span in _SPAN.findall(line):
            m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\((.*)\)", span.strip())
            if not m:
                continue
            found.append((m.group(1), _param_names(m.group(2))))
    return found


def _public_apis():
    import ndist.cuda
    import ndist.distributed
    import ndist.multiprocessing

    extra_mp = [n for n in ndist.multiprocessing.__all__ if n not in multiprocessing.__all__]
    return {
        "ndist.distributed": (ndist.distributed, list(ndist.distributed.__all__)),
        "ndist.multiprocessing": (ndist.multiprocessing, extra_mp),
        "ndist.cuda": (ndist.cuda, list(ndist.cuda.__all__)),
    }


@pytest.mark.parametrize("module", ["ndist.distributed", "ndist.multiprocessing", "ndist.cuda"])
def test_every_public_name_is_documented(module):
    _, names = _public_apis()[module]
    assert names, f"{module} exports nothing?"
    missing = sorted(set(names) - documented_names(_read("api.md")))
    assert not missing, f"docs/api.md does not document these {module} names: {missing}"


def test_checker_notices_a_missing_name():
    text = "#### `all_reduce(tensor, op=ReduceOp.SUM)`\n\nsee `broadcast` and all_gather\n"
    names = documented_names(text)
    assert {"all_reduce", "broadcast"} <= names
    assert "all_gather" not in names  # mentioned, but not as code
    assert "ReduceOp" not in names  # only inside another name's span


def test_heading_signatures_match_the_code():
    by_module = _public_apis()
    objects = {}
    for module, names in by_module.values():
        for name in names:
            objects.setdefault(name, getattr(module, name))
    sigs = heading_signatures(_read("api.md"))
    assert len(sigs) >= 40, "the signature headings of docs/api.md were not found"
    wrong = []
    for name, params in sigs:
        obj = objects.get(name)
        if obj is None:
            wrong.append(f"{name}: documented with a signature but not a public name")
            continue
        real = [p for p in inspect.signature(obj).parameters if p not in ("self", "cls")]
        if params != real:
            wrong.append(f"{name}: docs say ({', '.join(params)}), code has ({', '.join(real)})")
    assert not wrong, "docs/api.md signatures out of date:\n" + "\n".join(wrong)


def test_heading_signature_checker_sees_a_wrong_parameter():
    assert heading_signatures("#### `send(tensor, dst=None, grp=None)`, `recv(x)`") == [
        ("send", ["tensor", "dst", "grp"]), ("recv", ["x"])]
    assert heading_signatures("## `f(a, devices=(\"cpu\", \"cuda\"), b=g(1, 2))`") == [("f", ["a", "devices", "b"])]


# Upper-case string constants in the source that are not environment variables
# (names ending in "_" are prefixes, filtered below).
_NOT_ENV = {"NDIST_BACKENDS", "MPI_LIBRARIES", "MPI_LOCAL"}


def _env_vars_read_by_code() -> set[str]:
    """Every NDIST_* / launcher / MPI / Slurm variable named as a string literal in the package."""
    found = set()
    pattern = re.compile((
        r"""["']((?:NDIST_|MASTER_|OMPI_|PMI_|PMIX_|MPI_|SLURM_)[A-Z0-9_]*|RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE)["']"""
    ))
    for dirpath, _, files in os.walk(os.path.join(ROOT, "ndist")):
        for fn in files:
            if fn.endswith(".py"):
                with open(os.path.join(dirpath, fn), encoding="utf-8") as f:
                    found.update(pattern.findall(f.read()))
    return found


def test_every_environment_variable_is_in_the_troubleshooting_table():
    text = _read("troubleshooting.md")
    table = {m for line in text.splitlines() if line.startswith("|") for m in _SPAN.findall(line)}
    names = _env_vars_read_by_code()
    assert "NDIST_SECRET" in names and "NDIST_TRANSPORT" in names
    missing = sorted(n for n in names - _NOT_ENV if n not in table and not n.endswith("_"))
    assert not missing, f"docs/troubleshooting.md's environment table lacks: {missing}"


def test_docs_index_lists_every_doc():
    index = _read("README.md")
    docs = sorted(f for f in os.listdir(DOCS) if f.endswith(".md") and f != "README.md")
    missing = [f for f in docs if f"({f})" not in index]
    assert not missing, f"docs/README.md does not index: {missing}"


def _mpi_pages_without_the_extra() -> list[str]:
    """Pages that show an ``mpiexec`` command but never name the ``[mpi]`` extra."""
    pages = {"README.md": os.path.join(ROOT, "README.md")}
    pages.update({f"docs/{n}": os.path.join(DOCS, n) for n in os.listdir(DOCS) if n.endswith(".md")})
    bad = []
    for name, path in sorted(pages.items()):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if re.search(r"\bmpiexec -n\b", text) and "[mpi]" not in text:
            bad.append(name)
    return bad


def test_pages_showing_mpiexec_name_the_mpi_extra():
    assert not _mpi_pages_without_the_extra()


# The contributors' maps: every source file they name is in the repository (a path may be
# written from any folder down, ``native/_engine.py`` or ``_api.py``), and every link to a
# section (``[..](page.md#anchor)``, ``[..](#anchor)``) finds a heading of that page.
MAPS = ("architecture.md", "socket.md")
_PATH = re.compile(r"[A-Za-z0-9_./-]+\.(?:py|c|h|cpp|sh)\b")
_LINK = re.compile(r"\]\(([A-Za-z0-9_.-]*\.md)?(?:#([a-z0-9_-]+))?\)")


def _repo_files() -> list[str]:
    found = []
    for top in ("ndist", "tests", "tools", "benchmarks", ".ci", "docs"):
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "build")]
            found += [os.path.relpath(os.path.join(dirpath, f), ROOT).replace(os.sep, "/") for f in files]
    return found + [f for f in os.listdir(ROOT) if os.path.isfile(os.path.join(ROOT, f))]


def missing_files(text: str, files: list[str]) -> list[str]:
    """The paths named in ``text``'s code spans that no file of ``files`` ends with."""
    named = {m.group(0).lstrip("./") for span in _SPAN.findall(text) for m in _PATH.finditer(span)}
    return sorted(p for p in named if not any(f == p or f.endswith("/" + p) for f in files))


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(page: str, text: str) -> list[str]:
    bad = []
    for target, anchor in _LINK.findall(text):
        other = target or page
        if not os.path.exists(os.path.join(DOCS, other)):
            bad.append(f"{target}#{anchor}: no such page")
            continue
        if anchor:
            headings = [line.lstrip("#") for line in _read(other).splitlines() if line.startswith("#")]
            if anchor not in {_anchor(h) for h in headings}:
                bad.append(f"{other}#{anchor}: no such section")
    return bad


@pytest.mark.parametrize("page", MAPS)
def test_the_maps_name_files_that_exist_and_sections_that_exist(page):
    text = _read(page)
    gone = missing_files(text, _repo_files())
    assert not gone, f"docs/{page} names files that are not in the repository: {gone}"
    bad = broken_links(page, text)
    assert not bad, f"docs/{page} links to what is not there: {bad}"


def test_the_map_checks_find_a_missing_file_and_a_missing_section():
    files = ["ndist/collectives/_api.py", "ndist/collectives/backends/socket/native/_engine.py"]
    text = "`_api.py`, `native/_engine.py` (`engine/_engine.py`: gone), `collectives/_gone.py`, a `name`"
    assert missing_files(text, files) == ["collectives/_gone.py", "engine/_engine.py"]
    assert _anchor(" Two-level algorithms (a group on several hosts)") == "two-level-algorithms-a-group-on-several-hosts"
    assert broken_links("architecture.md", "[a](#words) [b](#no-such-words) [c](socket.md#layout-one-sub-package-per-concern) "
                        "[d](nowhere.md)") == ["architecture.md#no-such-words: no such section", "nowhere.md#: no such page"]
