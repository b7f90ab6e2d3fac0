"""The socket backend's two engines behind one interface (``_engines.CollectiveEngine``),
and the one place that chooses between them (``_engines.select``)."""

import inspect

import pytest

from ndist.collectives.backends.socket import _engines
from ndist.collectives.backends.socket.engine._algorithms import Algorithms
from ndist.collectives.backends.socket.native._engine import NativeAlgorithms

OPS = [n for n, v in vars(_engines.CollectiveEngine).items() if callable(v) and not n.startswith("_")]


def test_the_interface_names_every_collective():
    assert sorted(OPS) == ["all_gather", "all_reduce", "all_to_all", "barrier", "broadcast", "direct_reduce",
                           "gather", "reduce_scatter", "scatter"]


@pytest.mark.parametrize("impl", [Algorithms, NativeAlgorithms])
@pytest.mark.parametrize("op", OPS)
def test_both_engines_implement_every_op_with_the_interfaces_parameters(impl, op):
    want = list(inspect.signature(getattr(_engines.CollectiveEngine, op)).parameters)
    got = list(inspect.signature(getattr(impl, op)).parameters)
    assert got == want, (impl.__name__, op, got, want)


def test_select_runs_native_only_when_every_peer_is_on_this_host_with_the_same_slots():
    same = {1: True, 2: True}
    pub = {1: {"native": 4096}, 2: {"native": 4096}}
    assert _engines.select(4096, [1, 2], same, pub) == _engines.NATIVE
    assert _engines.select(0, [1, 2], same, pub) == _engines.PYTHON  # this rank offers none
    assert _engines.select(4096, [1, 2], {1: True, 2: False}, pub) == _engines.PYTHON  # a peer elsewhere
    assert _engines.select(4096, [1, 2], same, {1: {"native": 4096}, 2: {"native": 8192}}) == _engines.PYTHON
    assert _engines.select(4096, [1, 2], same, {1: {"native": 4096}, 2: {"native": 0}}) == _engines.PYTHON


def test_select_runs_the_tcp_engine_on_a_group_across_hosts_that_every_rank_offers_it():
    elsewhere = {1: False, 2: False}
    pub = {1: {"native": 4096, "native_tcp": "auto"}, 2: {"native": 4096, "native_tcp": "auto"}}
    sel = _engines.select
    assert sel(4096, [1, 2], elsewhere, pub, "auto", spans=True) == _engines.NATIVE_TCP
    assert sel(4096, [1, 2], elsewhere, pub, "auto", spans=False) == _engines.PYTHON  # one host, over TCP
    assert sel(4096, [1, 2], elsewhere, pub, "", spans=True) == _engines.PYTHON  # this rank offers none
    assert sel(4096, [1, 2], elsewhere, {**pub, 2: {"native_tcp": ""}}, "auto", spans=True) == _engines.PYTHON
    # "always" on every rank: also one host's group over TCP (how the suites run it)
    always = {1: {"native_tcp": "always"}, 2: {"native_tcp": "always"}}
    assert sel(0, [1, 2], elsewhere, always, "always", spans=False) == _engines.NATIVE_TCP
    assert sel(0, [1, 2], elsewhere, {**always, 2: {"native_tcp": "auto"}}, "always", spans=False) == _engines.PYTHON
    # shared memory first: a same-host group with slots runs the same-host engine
    assert sel(4096, [1, 2], {1: True, 2: True}, pub, "always", spans=False) == _engines.NATIVE
    # more ranks than the TCP engine's direct algorithms are for: the Python engine's schedules
    many = {p: {"native_tcp": "auto"} for p in range(1, 9)}
    assert sel(0, list(many), {}, many, "auto", spans=True, tcp_max=8) == _engines.PYTHON
    assert sel(0, list(many)[:7], {}, many, "auto", spans=True, tcp_max=8) == _engines.NATIVE_TCP


def test_select_runs_two_levels_where_a_host_has_more_than_one_rank_and_every_rank_offers_slots():
    pub = {p: {"native": 4096, "native_tcp": "auto"} for p in (1, 2, 3)}
    same = {1: True, 2: False, 3: False}
    sel = _engines.select
    assert sel(4096, [1, 2, 3], same, pub, "auto", True, 8, (0, 0, 1, 1)) == _engines.NATIVE_TWO
    assert sel(4096, [1, 2, 3], same, pub, "auto", True, 8, (0, 1, 2, 3)) == _engines.NATIVE_TCP  # one per host
    assert sel(0, [1, 2, 3], same, pub, "auto", True, 8, (0, 0, 1, 1)) == _engines.NATIVE_TCP  # no slots here
    assert sel(4096, [1, 2, 3], same, {**pub, 3: {"native": 8192, "native_tcp": "auto"}}, "auto", True, 8,
               (0, 0, 1, 1)) == _engines.NATIVE_TCP  # slots of another size
    assert sel(4096, [1, 2, 3], same, pub, "", True, 8, (0, 0, 1, 1)) == _engines.PYTHON  # no TCP offer
    # one machine taken for two hosts (NDIST_NATIVE_HOSTS): every peer on this host, yet two levels
    assert sel(4096, [1, 2, 3], {1: True, 2: True, 3: True}, pub, "auto", True, 8, (0, 0, 1, 1)) == \
        _engines.NATIVE_TWO
