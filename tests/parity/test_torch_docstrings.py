"""torch 2.13's docstring examples for the collectives, ported to ndist.

Each example is a small program (``torch`` -> ``ndist``, CUDA devices -> CPU)
run on real processes with ``run_ranks`` at the world size its docstring
assumes. Each returns, per rank, the ``repr`` of what the docstring displays,
and the test compares it with the docstring's own output, transcribed below
(``device='cuda:N'`` removed). The examples of one world size run one after
another in one job (``EXAMPLES``, launched once and cached, on one xdist worker:
``one_launch``), each test reading its own example's outcome; two run in a job of
their own: ``monitored_barrier`` (its timeouts) and ``send_object_list`` without a
barrier (the ranks exit right after it). Values are always compared; the text is compared
too, except where the docstring's text is not what torch itself prints (marked
``exact=False`` with the reason). torch is not needed to run these.

Examples that need torch-only features, and how they are ported:
* ``new_subgroups()`` (default group size = CUDA device count, 8 per machine):
  needs CUDA; ported with ``group_size=8`` (without CUDA, torch and ndist raise).
* ``new_subgroups(ranks=[[0, 2], [1, 3]])`` (new_subgroups_by_enumeration's
  docstring): ``new_subgroups`` has no ``ranks``; ported to
  ``new_subgroups_by_enumeration``, which the docstring documents.
* ``all_reduce`` / ``all_gather`` / ``gather`` / ``scatter`` / ``*_single``:
  the docstrings place tensors on ``cuda:<rank>``; ported to CPU.
``reduce``, ``broadcast``, ``reduce_scatter``, ``all_reduce_coalesced`` and
``new_group`` have no example in torch 2.13; ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` point to the ``*_single`` examples, which are run
under both names.
"""

from __future__ import annotations

import functools
import traceback

import pytest

from ndist.testing import run_ranks
from tests.collectives.collective_launch import one_launch


def _values(text: str):
    """The data the docstring's text shows: ``tensor([1, 2])`` -> ``[1, 2]``."""
    return eval(text, {"tensor": lambda data, **kw: data, "None": None})  # noqa: S307 - our own literals


def check(out, expected, exact=True):
    assert len(out) == len(expected), out
    for rank, (got, want) in enumerate(zip(out, expected)):
        assert [_values(g) for g in got] == [_values(w) for w in want], f"rank {rank}: {got} != {want}"
        if exact:
            assert got == want, f"rank {rank}: {got} != {want}"


def run(fn, world_size, *args):
    return run_ranks(fn, world_size, args=args, timeout=120)


def _examples_job(rank, world_size, examples):
    """Every example of ``examples`` (``[(name, body, args)]``) in turn on one group: ``{name:
    ("ok", what it returned) or ("error", its traceback)}``. A group timeout well inside the
    job's: an example that fails on one rank leaves the others' call to time out, and the job
    goes on to the next."""
    import ndist.distributed as dist

    dist.init_process_group(timeout=30)
    out = {}
    for name, body, args in examples:
        try:
            out[name] = ("ok", body(rank, world_size, *args))
        except Exception:  # noqa: BLE001 - the example's test shows it
            out[name] = ("error", traceback.format_exc())
    dist.destroy_process_group()
    return out


@functools.lru_cache(maxsize=None)
def _job(world_size: int):
    """The outcome of ``EXAMPLES``' examples of ``world_size`` by rank, or why the job failed."""
    examples = [(name, body, args) for name, (ws, body, args) in EXAMPLES.items() if ws == world_size]
    try:
        return list(run_ranks(_examples_job, world_size, args=(examples,), init=False, timeout=180))
    except Exception as err:  # noqa: BLE001 - every example's test says it
        return f"the job of the world size {world_size} examples failed: {type(err).__name__}: {err}"


def ran(name: str, world_size: int):
    """Example ``name``'s result by rank, from its world size's job (run once). Fails with
    every rank's error in it, and names the examples before it in the job that failed (whose
    ranks may have left the others out of step: this one's errors may be theirs)."""
    assert EXAMPLES[name][0] == world_size, (name, world_size)
    per_rank = _job(world_size)
    assert not isinstance(per_rank, str), per_rank
    errors = [f"rank {rank}: {results[name][1]}" for rank, results in enumerate(per_rank)
              if results[name][0] != "ok"]
    if errors:
        names = list(per_rank[0])
        before = [n for n in names[:names.index(name)] if any(r[n][0] != "ok" for r in per_rank)]
        blame = f" (examples before it in the same job failed: {before})" if before else ""
        pytest.fail(f"example {name} failed{blame}:\n" + "\n".join(errors), pytrace=False)
    return [results[name][1] for results in per_rank]


def _launch(world_size: int):
    """The test's parameter: its world size's job (the tests of one job run on one worker)."""
    return pytest.mark.parametrize("ws", [one_launch(f"docstrings-{world_size}", world_size, id=f"ws{world_size}")])


# ------------------------------------------------------------------ all_reduce
def _all_reduce_int(rank, ws):
    import ndist
    import ndist.distributed as dist
    from ndist.distributed import ReduceOp

    tensor = ndist.arange(2, dtype=ndist.int64) + 1 + 2 * rank
    before = repr(tensor)
    dist.all_reduce(tensor, op=ReduceOp.SUM)
    return [before, repr(tensor)]


@pytest.mark.timeout(240)
@_launch(2)
def test_all_reduce_int64(ws):
    check(ran("all_reduce_int64", ws), [["tensor([1, 2])", "tensor([4, 6])"], ["tensor([3, 4])", "tensor([4, 6])"]])


def _all_reduce_cfloat(rank, ws):
    import ndist
    import ndist.distributed as dist
    from ndist.distributed import ReduceOp

    tensor = ndist.tensor([1 + 1j, 2 + 2j], dtype=ndist.cfloat) + 2 * rank * (1 + 1j)
    before = repr(tensor)
    dist.all_reduce(tensor, op=ReduceOp.SUM)
    return [before, repr(tensor)]


@pytest.mark.timeout(240)
@_launch(2)
def test_all_reduce_cfloat(ws):
    check(ran("all_reduce_cfloat", ws), [["tensor([1.+1.j, 2.+2.j])", "tensor([4.+4.j, 6.+6.j])"],
                                       ["tensor([3.+3.j, 4.+4.j])", "tensor([4.+4.j, 6.+6.j])"]])


# ------------------------------------------------------------------ all_gather
def _all_gather_int(rank, ws):
    import ndist
    import ndist.distributed as dist

    tensor_list = [ndist.zeros(2, dtype=ndist.int64) for _ in range(2)]
    first = repr(tensor_list)
    tensor = ndist.arange(2, dtype=ndist.int64) + 1 + 2 * rank
    dist.all_gather(tensor_list, tensor)
    return [first, repr(tensor), repr(tensor_list)]


@pytest.mark.timeout(240)
@_launch(2)
def test_all_gather_int64(ws):
    check(ran("all_gather_int64", ws), [
        ["[tensor([0, 0]), tensor([0, 0])]", "tensor([1, 2])", "[tensor([1, 2]), tensor([3, 4])]"],
        ["[tensor([0, 0]), tensor([0, 0])]", "tensor([3, 4])", "[tensor([1, 2]), tensor([3, 4])]"]])


def _all_gather_cfloat(rank, ws):
    import ndist
    import ndist.distributed as dist

    tensor_list = [ndist.zeros(2, dtype=ndist.cfloat) for _ in range(2)]
    first = repr(tensor_list)
    tensor = ndist.tensor([1 + 1j, 2 + 2j], dtype=ndist.cfloat) + 2 * rank * (1 + 1j)
    dist.all_gather(tensor_list, tensor)
    return [first, repr(tensor), repr(tensor_list)]


@pytest.mark.timeout(240)
@_launch(2)
def test_all_gather_cfloat(ws):
    zeros = "[tensor([0.+0.j, 0.+0.j]), tensor([0.+0.j, 0.+0.j])]"
    gathered = "[tensor([1.+1.j, 2.+2.j]), tensor([3.+3.j, 4.+4.j])]"
    check(ran("all_gather_cfloat", ws), [[zeros, "tensor([1.+1.j, 2.+2.j])", gathered],
                                       [zeros, "tensor([3.+3.j, 4.+4.j])", gathered]])


# ---------------------------------------------- all_gather_single (+ old name)
def _all_gather_single(rank, world_size, name):
    import ndist
    import ndist.distributed as dist

    op = getattr(dist, name)
    tensor_in = ndist.arange(2, dtype=ndist.int64) + 1 + 2 * rank
    tensor_out = ndist.zeros(world_size * 2, dtype=ndist.int64)
    op(tensor_out, tensor_in)
    tensor_out2 = ndist.zeros(world_size, 2, dtype=ndist.int64)
    op(tensor_out2, tensor_in)
    return [repr(tensor_in), repr(tensor_out), repr(tensor_out2)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["all_gather_single", "all_gather_into_tensor"])
@_launch(2)
def test_all_gather_single_concat_and_stack(ws, name):
    stacked = "tensor([[1, 2],\n        [3, 4]])"
    check(ran(f"all_gather_single[{name}]", ws), [["tensor([1, 2])", "tensor([1, 2, 3, 4])", stacked],
                                             ["tensor([3, 4])", "tensor([1, 2, 3, 4])", stacked]])


# ------------------------------------------------------------- gather, scatter
def _gather(rank, ws):
    import ndist
    import ndist.distributed as dist

    tensor_size = 2
    tensor = ndist.ones(tensor_size) + rank
    if dist.get_rank() == 0:
        gather_list = [ndist.zeros_like(tensor) for i in range(2)]
    else:
        gather_list = None
    dist.gather(tensor, gather_list, dst=0)
    return [repr(gather_list)]


@pytest.mark.timeout(240)
@_launch(2)
def test_gather(ws):
    check(ran("gather", ws), [["[tensor([1., 1.]), tensor([2., 2.])]"], ["None"]])


def _scatter(rank, ws):
    import ndist
    import ndist.distributed as dist

    tensor_size = 2
    output_tensor = ndist.zeros(tensor_size)
    if dist.get_rank() == 0:
        t_ones = ndist.ones(tensor_size)
        t_fives = ndist.ones(tensor_size) * 5
        scatter_list = [t_ones, t_fives]
    else:
        scatter_list = None
    dist.scatter(output_tensor, scatter_list, src=0)
    return [repr(output_tensor)]


@pytest.mark.timeout(240)
@_launch(2)
def test_scatter(ws):
    check(ran("scatter", ws), [["tensor([1., 1.])"], ["tensor([5., 5.])"]])


# ---------------------------------------- reduce_scatter_single (+ old name)
def _reduce_scatter_single(rank, world_size, name):
    import ndist
    import ndist.distributed as dist

    op = getattr(dist, name)
    tensor_out = ndist.zeros(2, dtype=ndist.int64)
    tensor_in = ndist.arange(world_size * 2, dtype=ndist.int64)
    shown = [repr(tensor_in)]
    op(tensor_out, tensor_in)
    shown.append(repr(tensor_out))
    tensor_in = ndist.reshape(tensor_in, (world_size, 2))
    shown.append(repr(tensor_in))
    op(tensor_out, tensor_in)
    shown.append(repr(tensor_out))
    return shown


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["reduce_scatter_single", "reduce_scatter_tensor"])
@_launch(2)
def test_reduce_scatter_single_concat_and_stack(ws, name):
    stacked = "tensor([[0, 1],\n        [2, 3]])"
    check(ran(f"reduce_scatter_single[{name}]", ws), [
        ["tensor([0, 1, 2, 3])", "tensor([0, 2])", stacked, "tensor([0, 2])"],
        ["tensor([0, 1, 2, 3])", "tensor([4, 6])", stacked, "tensor([4, 6])"]])


# ------------------------------------------------------------------ all_to_all
_EVEN_OUT = ["[tensor([0]), tensor([4]), tensor([8]), tensor([12])]",
             "[tensor([1]), tensor([5]), tensor([9]), tensor([13])]",
             "[tensor([2]), tensor([6]), tensor([10]), tensor([14])]",
             "[tensor([3]), tensor([7]), tensor([11]), tensor([15])]"]


def _scatter_loop(dist, scatter_list, gather_list, rank, world_size):
    """The docstrings' "Essentially, it is similar to following operation": a scatter from every rank."""
    for i in range(world_size):
        dist.scatter(gather_list[i], scatter_list if i == rank else [], src=i)


def _all_to_all_even(rank, world_size, via_scatter):
    import ndist
    import ndist.distributed as dist

    input = ndist.arange(4) + rank * 4
    input = list(input.chunk(4))
    shown = [repr(input)]
    output = list(ndist.empty([4], dtype=ndist.int64).chunk(4))
    if via_scatter:  # "Essentially, it is similar to following operation"
        _scatter_loop(dist, input, output, rank, world_size)
    else:
        dist.all_to_all(output, input)
    return shown + [repr(output)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("via_scatter", [False, True], ids=["all_to_all", "scatter_loop"])
@_launch(4)
def test_all_to_all_even(ws, via_scatter):
    inputs = ["[tensor([0]), tensor([1]), tensor([2]), tensor([3])]",
              "[tensor([4]), tensor([5]), tensor([6]), tensor([7])]",
              "[tensor([8]), tensor([9]), tensor([10]), tensor([11])]",
              "[tensor([12]), tensor([13]), tensor([14]), tensor([15])]"]
    check(ran(f"all_to_all_even[{via_scatter}]", ws), [[i, o] for i, o in zip(inputs, _EVEN_OUT)])


_UNEVEN_IN = [[0, 1, 2, 3, 4, 5], [10, 11, 12, 13, 14, 15, 16, 17, 18], [20, 21, 22, 23, 24],
              [30, 31, 32, 33, 34, 35, 36]]
_IN_SPLITS = [[2, 2, 1, 1], [3, 2, 2, 2], [2, 1, 1, 1], [2, 2, 2, 1]]
_OUT_SPLITS = [[2, 3, 2, 2], [2, 2, 1, 2], [1, 2, 1, 2], [1, 2, 1, 1]]


def _all_to_all_uneven(rank, ws):
    import ndist
    import ndist.distributed as dist

    input = ndist.tensor(_UNEVEN_IN[rank])
    input_splits, output_splits = _IN_SPLITS[rank], _OUT_SPLITS[rank]
    input = list(input.split(input_splits))
    shown = [repr(input)]
    output = [ndist.empty(n, dtype=ndist.int64) for n in output_splits]  # the docstring's "output = ..."
    dist.all_to_all(output, input)
    return shown + [repr(output)]


@pytest.mark.timeout(240)
@_launch(4)
def test_all_to_all_uneven(ws):
    check(ran("all_to_all_uneven", ws), [
        ["[tensor([0, 1]), tensor([2, 3]), tensor([4]), tensor([5])]",
         "[tensor([0, 1]), tensor([10, 11, 12]), tensor([20, 21]), tensor([30, 31])]"],
        ["[tensor([10, 11, 12]), tensor([13, 14]), tensor([15, 16]), tensor([17, 18])]",
         "[tensor([2, 3]), tensor([13, 14]), tensor([22]), tensor([32, 33])]"],
        ["[tensor([20, 21]), tensor([22]), tensor([23]), tensor([24])]",
         "[tensor([4]), tensor([15, 16]), tensor([23]), tensor([34, 35])]"],
        ["[tensor([30, 31]), tensor([32, 33]), tensor([34, 35]), tensor([36])]",
         "[tensor([5]), tensor([17, 18]), tensor([24]), tensor([36])]"]])


def _all_to_all_cfloat(rank, ws):
    import ndist
    import ndist.distributed as dist

    input = ndist.tensor([1 + 1j, 2 + 2j, 3 + 3j, 4 + 4j], dtype=ndist.cfloat) + 4 * rank * (1 + 1j)
    input = list(input.chunk(4))
    shown = [repr(input)]
    # the docstring's `output = list(torch.empty([4], dtype=torch.int64).chunk(4))` cannot receive
    # cfloat (torch raises too); the output it shows is cfloat
    output = list(ndist.empty([4], dtype=ndist.cfloat).chunk(4))
    dist.all_to_all(output, input)
    return shown + [repr(output)]


@pytest.mark.timeout(240)
@_launch(4)
def test_all_to_all_cfloat(ws):
    # exact=False: the docstring writes 1+1j where torch prints 1.+1.j
    check(ran("all_to_all_cfloat", ws), [
        ["[tensor([1+1j]), tensor([2+2j]), tensor([3+3j]), tensor([4+4j])]",
         "[tensor([1+1j]), tensor([5+5j]), tensor([9+9j]), tensor([13+13j])]"],
        ["[tensor([5+5j]), tensor([6+6j]), tensor([7+7j]), tensor([8+8j])]",
         "[tensor([2+2j]), tensor([6+6j]), tensor([10+10j]), tensor([14+14j])]"],
        ["[tensor([9+9j]), tensor([10+10j]), tensor([11+11j]), tensor([12+12j])]",
         "[tensor([3+3j]), tensor([7+7j]), tensor([11+11j]), tensor([15+15j])]"],
        ["[tensor([13+13j]), tensor([14+14j]), tensor([15+15j]), tensor([16+16j])]",
         "[tensor([4+4j]), tensor([8+8j]), tensor([12+12j]), tensor([16+16j])]"]], exact=False)


# ----------------------------------------------------------- all_to_all_single
def _all_to_all_single_even(rank, world_size, via_scatter):
    import ndist
    import ndist.distributed as dist

    input = ndist.arange(4) + rank * 4
    shown = [repr(input)]
    output = ndist.empty([4], dtype=ndist.int64)
    if via_scatter:
        _scatter_loop(dist, list(input.chunk(world_size)), list(output.chunk(world_size)), rank, world_size)
    else:
        dist.all_to_all_single(output, input)
    return shown + [repr(output)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("via_scatter", [False, True], ids=["all_to_all_single", "scatter_loop"])
@_launch(4)
def test_all_to_all_single_even(ws, via_scatter):
    # exact=False: torch pads to equal width (tensor([ 8,  9, 10, 11])); the docstring does not
    check(ran(f"all_to_all_single_even[{via_scatter}]", ws), [
        ["tensor([0, 1, 2, 3])", "tensor([0, 4, 8, 12])"], ["tensor([4, 5, 6, 7])", "tensor([1, 5, 9, 13])"],
        ["tensor([8, 9, 10, 11])", "tensor([2, 6, 10, 14])"],
        ["tensor([12, 13, 14, 15])", "tensor([3, 7, 11, 15])"]], exact=False)


def _all_to_all_single_uneven(rank, ws):
    import ndist
    import ndist.distributed as dist

    input = ndist.tensor(_UNEVEN_IN[rank])
    input_splits, output_splits = _IN_SPLITS[rank], _OUT_SPLITS[rank]
    output = ndist.empty(sum(output_splits), dtype=ndist.int64)  # the docstring's "output = ..."
    dist.all_to_all_single(output, input, output_splits, input_splits)
    return [repr(output)]


@pytest.mark.timeout(240)
@_launch(4)
def test_all_to_all_single_uneven(ws):
    check(ran("all_to_all_single_uneven", ws), [
        ["tensor([ 0,  1, 10, 11, 12, 20, 21, 30, 31])"], ["tensor([ 2,  3, 13, 14, 22, 32, 33])"],
        ["tensor([ 4, 15, 16, 23, 34, 35])"], ["tensor([ 5, 17, 18, 24, 36])"]])


def _all_to_all_single_cfloat(rank, ws):
    import ndist
    import ndist.distributed as dist

    input = ndist.tensor([1 + 1j, 2 + 2j, 3 + 3j, 4 + 4j], dtype=ndist.cfloat) + 4 * rank * (1 + 1j)
    shown = [repr(input)]
    output = ndist.empty([4], dtype=ndist.cfloat)  # the docstring's int64 output cannot hold cfloat
    dist.all_to_all_single(output, input)
    return shown + [repr(output)]


@pytest.mark.timeout(240)
@_launch(4)
def test_all_to_all_single_cfloat(ws):
    check(ran("all_to_all_single_cfloat", ws), [
        ["tensor([1+1j, 2+2j, 3+3j, 4+4j])", "tensor([1+1j, 5+5j, 9+9j, 13+13j])"],
        ["tensor([5+5j, 6+6j, 7+7j, 8+8j])", "tensor([2+2j, 6+6j, 10+10j, 14+14j])"],
        ["tensor([9+9j, 10+10j, 11+11j, 12+12j])", "tensor([3+3j, 7+7j, 11+11j, 15+15j])"],
        ["tensor([13+13j, 14+14j, 15+15j, 16+16j])", "tensor([4+4j, 8+8j, 12+12j, 16+16j])"]], exact=False)


# --------------------------------------------------------- object collectives
def _broadcast_object_list(rank, ws):
    import ndist
    import ndist.distributed as dist

    if dist.get_rank() == 0:
        objects = ["foo", 12, {1: 2}]
    else:
        objects = [None, None, None]
    device = ndist.device("cpu")
    dist.broadcast_object_list(objects, src=0, device=device)
    return [repr(objects)]


def _all_gather_object(rank, ws):
    import ndist.distributed as dist

    gather_objects = ["foo", 12, {1: 2}]
    output = [None for _ in gather_objects]
    dist.all_gather_object(output, gather_objects[dist.get_rank()])
    return [repr(output)]


def _gather_object(rank, ws):
    import ndist.distributed as dist

    gather_objects = ["foo", 12, {1: 2}]
    output = [None for _ in gather_objects]
    dist.gather_object(gather_objects[dist.get_rank()], output if dist.get_rank() == 0 else None, dst=0)
    return [repr(output)] if rank == 0 else []


def _scatter_object_list(rank, ws):
    import ndist.distributed as dist

    if dist.get_rank() == 0:
        objects = ["foo", 12, {1: 2}]
    else:
        objects = [None, None, None]
    output_list = [None]
    dist.scatter_object_list(output_list, objects, src=0)
    return [repr(output_list)]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("body, want", [
    (_broadcast_object_list, [["['foo', 12, {1: 2}]"]] * 3),
    (_all_gather_object, [["['foo', 12, {1: 2}]"]] * 3),
    (_gather_object, [["['foo', 12, {1: 2}]"], [], []]),
    # the docstring shows rank 2 ([{1: 2}]); rank i gets objects[i]
    (_scatter_object_list, [["['foo']"], ["[12]"], ["[{1: 2}]"]]),
], ids=["broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"])
@_launch(3)
def test_object_collective(ws, body, want):
    check(ran(body.__name__, ws), want)


def _send_recv_object_list(rank, ws, barrier):
    import ndist
    import ndist.distributed as dist

    device = ndist.device("cpu")
    if dist.get_rank() == 0:
        objects = ["foo", 12, {1: 2}]
        dist.send_object_list(objects, dst=1, device=device)
    else:
        objects = [None, None, None]
        dist.recv_object_list(objects, src=0, device=device)
    if barrier:
        dist.barrier()
    return [repr(objects)]


@pytest.mark.timeout(150)
def test_send_object_list_recv_object_list():
    check(run(_send_recv_object_list, 2, False), [["['foo', 12, {1: 2}]"]] * 2)


@pytest.mark.timeout(240)
@_launch(2)
def test_send_object_list_recv_object_list_then_barrier(ws):
    # the same program, with a barrier after it
    check(ran("send_recv_object_list_then_barrier", ws), [["['foo', 12, {1: 2}]"]] * 2)


# ---------------------------------------------------------- batch_isend_irecv
def _batch_isend_irecv(rank, world_size):
    import ndist
    import ndist.distributed as dist
    from ndist.distributed import batch_isend_irecv

    send_tensor = ndist.arange(2, dtype=ndist.float32) + 2 * rank
    recv_tensor = ndist.randn(2, dtype=ndist.float32)
    send_op = dist.P2POp(dist.isend, send_tensor, (rank + 1) % world_size)
    recv_op = dist.P2POp(dist.irecv, recv_tensor, (rank - 1 + world_size) % world_size)
    reqs = batch_isend_irecv([send_op, recv_op])
    for req in reqs:
        req.wait()
    return [repr(recv_tensor)]


@pytest.mark.timeout(240)
@_launch(2)
def test_batch_isend_irecv(ws):
    # exact=False: recv_tensor is float32; the docstring prints it as integers
    check(ran("batch_isend_irecv", ws), [["tensor([2, 3])"], ["tensor([0, 1])"]], exact=False)


# ----------------------------------------------------------- all_gather_coalesced
def _all_gather_coalesced(rank, ws):
    import ndist
    import ndist.distributed as dist

    if rank == 0:
        input_tensor_list = [ndist.tensor([[1, 1], [1, 1]]), ndist.tensor([2]), ndist.tensor([3, 3])]
    else:
        input_tensor_list = [ndist.tensor([[3, 3], [3, 3]]), ndist.tensor([5]), ndist.tensor([1, 1])]
    output_tensor_lists = [[ndist.tensor([[-1, -1], [-1, -1]]), ndist.tensor([-1]), ndist.tensor([-1, -1])]
                           for _ in range(2)]
    dist.all_gather_coalesced(output_tensor_lists, input_tensor_list)
    return [repr([[t.tolist() for t in row] for row in output_tensor_lists])]


@pytest.mark.timeout(240)
@_launch(2)
def test_all_gather_coalesced(ws):
    both = "[[[[1, 1], [1, 1]], [2], [3, 3]], [[[3, 3], [3, 3]], [5], [1, 1]]]"
    check(ran("all_gather_coalesced", ws), [[both], [both]])


# ------------------------------------------------------------------- subgroups
def _new_subgroups(rank, ws):
    import ndist
    import ndist.distributed as dist

    cur_subgroup, subgroups = dist.new_subgroups(group_size=8)  # torch: the CUDA device count
    rank = dist.get_rank()
    tensor = ndist.ones(1, dtype=ndist.int64) * rank  # torch.ones(1, device=rank): see below
    dist.all_reduce(tensor, group=cur_subgroup)
    for subgroup in subgroups:
        dist.destroy_process_group(subgroup)
    return [repr(tensor)]


@pytest.mark.timeout(240)
@_launch(8)
def test_new_subgroups(ws):
    # the docstring prints tensor([28]) for a float tensor; an int64 one prints exactly that
    check(ran("new_subgroups", ws), [["tensor([28])"]] * 8)


def _new_subgroups_by_enumeration(rank, ws):
    import ndist
    import ndist.distributed as dist

    cur_subgroup, subgroups = dist.new_subgroups_by_enumeration([[0, 2], [1, 3]])
    rank = dist.get_rank()
    tensor = ndist.ones(1) * rank
    dist.all_reduce(tensor, group=cur_subgroup)
    return [repr(tensor)]


@pytest.mark.timeout(240)
@_launch(4)
def test_new_subgroups_by_enumeration(ws):
    # exact=False: ones(1) * rank is float (tensor([2.])); the docstring prints tensor([2])
    check(ran("new_subgroups_by_enumeration", ws), [["tensor([2])"], ["tensor([4])"], ["tensor([2])"],
                                                  ["tensor([4])"]], exact=False)


# ---------------------------------------------------------- monitored_barrier
def _monitored_barrier(rank, ws, part, folder):
    import os
    import time
    from datetime import timedelta

    import ndist.distributed as dist

    timeout = timedelta(seconds=2)  # the docstring uses the default (30 min)
    callers = [r for r in range(ws) if (r != 1 if part == 1 else r == 0)]
    if rank not in callers:  # stays (in the group, not in the barrier) until every caller is out
        deadline = time.monotonic() + 60
        while not all(os.path.exists(os.path.join(folder, f"{part}-{r}")) for r in callers):
            assert time.monotonic() < deadline, "the callers did not come out of monitored_barrier"
            time.sleep(0.05)
        return []
    try:
        dist.monitored_barrier(timeout=timeout, wait_all_ranks=part == 2)
        return ["passed"]
    except dist.DistTimeoutError as err:
        return [repr(str(err).split(": ", 1)[1])]
    finally:
        open(os.path.join(folder, f"{part}-{rank}"), "w").close()


@pytest.mark.timeout(150)
def test_monitored_barrier(tmp_path):
    out = run(_monitored_barrier, 3, 1, str(tmp_path))
    assert "Rank 1 failed to pass monitoredBarrier" in out[0][0], out  # "rank 1 did not call into"
    assert "Rank 1 failed" in out[2][0], out
    out = run(_monitored_barrier, 3, 2, str(tmp_path))
    assert "Ranks 1, 2 failed to pass monitoredBarrier" in out[0][0], out  # "ranks 1, 2, ... world_size - 1"


# ----------------------------------------------------------------- DeviceMesh
def _device_mesh(rank, ws):
    import ndist.distributed as dist
    from ndist.distributed import init_device_mesh

    mesh_2d = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    tp_mesh = mesh_2d["tp"]
    dp_mesh = mesh_2d["dp"]
    return [repr(tp_mesh.mesh.tolist()), repr(dp_mesh.mesh.tolist()),
            repr([mesh_2d.get_local_rank(mesh_dim=0), mesh_2d.get_local_rank(mesh_dim=1)]),
            repr(dist.get_process_group_ranks(tp_mesh.get_group()))]


@pytest.mark.timeout(240)
@_launch(8)
def test_device_mesh_getitem_and_get_local_rank(ws):
    # DeviceMesh.__getitem__ / get_local_rank docstrings (world size 8): mesh_2d["tp"] on ranks 0-3
    # is [0, 1, 2, 3], on 4-7 [4, 5, 6, 7]; mesh_2d["dp"] on ranks 0, 4 is [0, 4], ...;
    # get_local_rank(mesh_dim=0) is 0 on ranks 0-3, 1 on 4-7; mesh_dim=1 is rank % 4
    expected = [[repr([r // 4 * 4 + i for i in range(4)]), repr([r % 4, r % 4 + 4]), repr([r // 4, r % 4]),
                 repr([r // 4 * 4 + i for i in range(4)])] for r in range(8)]
    check(ran("device_mesh", ws), expected)


#: every example run in a job of its world size: ``{name: (world size, body, args)}``, in the
#: order they run (the groups they make come last)
EXAMPLES = {
    "all_reduce_int64": (2, _all_reduce_int, ()),
    "all_reduce_cfloat": (2, _all_reduce_cfloat, ()),
    "all_gather_int64": (2, _all_gather_int, ()),
    "all_gather_cfloat": (2, _all_gather_cfloat, ()),
    **{f"all_gather_single[{n}]": (2, _all_gather_single, (n,)) for n in ("all_gather_single", "all_gather_into_tensor")},
    "gather": (2, _gather, ()),
    "scatter": (2, _scatter, ()),
    **{f"reduce_scatter_single[{n}]": (2, _reduce_scatter_single, (n,))
       for n in ("reduce_scatter_single", "reduce_scatter_tensor")},
    "all_gather_coalesced": (2, _all_gather_coalesced, ()),
    "batch_isend_irecv": (2, _batch_isend_irecv, ()),
    "send_recv_object_list_then_barrier": (2, _send_recv_object_list, (True,)),
    **{b.__name__: (3, b, ()) for b in (_broadcast_object_list, _all_gather_object, _gather_object,
                                        _scatter_object_list)},
    **{f"all_to_all_even[{v}]": (4, _all_to_all_even, (v,)) for v in (False, True)},
    "all_to_all_uneven": (4, _all_to_all_uneven, ()),
    "all_to_all_cfloat": (4, _all_to_all_cfloat, ()),
    **{f"all_to_all_single_even[{v}]": (4, _all_to_all_single_even, (v,)) for v in (False, True)},
    "all_to_all_single_uneven": (4, _all_to_all_single_uneven, ()),
    "all_to_all_single_cfloat": (4, _all_to_all_single_cfloat, ()),
    "new_subgroups_by_enumeration": (4, _new_subgroups_by_enumeration, ()),
    "device_mesh": (8, _device_mesh, ()),
    "new_subgroups": (8, _new_subgroups, ()),
}
