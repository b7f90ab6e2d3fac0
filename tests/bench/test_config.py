"""ndist-bench command line: sizes, sweeps and argument validation."""

import pytest

from ndist.bench import parse_args, parse_size, size_sweep

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "text, expected",
    [("8", 8), ("0", 0), ("1K", 1024), ("1k", 1024), ("64M", 64 << 20), ("1G", 1 << 30), ("2T", 2 << 40),
     ("1KB", 1024), ("4KiB", 4096), ("1.5M", 3 << 19), (" 16 ", 16)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "M", "-8", "1X", "1 M B x", "0.3", "1e3", "8 bytes"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="minbytes") as e:
        parse_size(text, name="minbytes")
    assert repr(text) in str(e.value)


def test_parse_size_type():
    with pytest.raises(TypeError, match="size: expected a str"):
        parse_size(8)


def test_size_sweep_factor_and_step():
    assert size_sweep(8, 64, 2) == [8, 16, 32, 64]
    assert size_sweep(8, 100, 4) == [8, 32]
    assert size_sweep(1 << 20, 3 << 20, 1, 1 << 20) == [1 << 20, 2 << 20, 3 << 20]
    assert size_sweep(8, 8, 2) == [8]


@pytest.mark.parametrize(
    "args, match",
    [((64, 8, 2), "maxbytes"), ((8, 64, 0), "stepfactor"), ((8, 64, 1, 0), "stepbytes"), ((0, 64, 2), "minbytes")],
)
def test_size_sweep_rejects(args, match):
    with pytest.raises(ValueError, match=match):
        size_sweep(*args)


def test_parse_args_spec_command():
    cfg = parse_args("all_reduce -b 8 -e 64M -f 2 -n 20 -w 5 -c 1 -d float32 -o sum --nproc 4 "
                     "--backend socket --compare mpi4py,torch".split())
    assert cfg.ops == ("all_reduce",)
    assert cfg.sizes[0] == 8 and cfg.sizes[-1] == 64 << 20 and len(cfg.sizes) == 24
    assert (cfg.iters, cfg.warmup, cfg.check, cfg.dtype, cfg.redop, cfg.nproc) == (20, 5, 1, "float32", "sum", 4)
    assert cfg.libraries == ("ndist[socket]", "mpi4py", "torch")


def test_parse_args_aliases_lists_and_all():
    cfg = parse_args(["all", "-d", "float", "--backend", "socket,mpi", "-b", "1K", "-e", "1K"])
    assert cfg.dtype == "float32"
    assert cfg.ops[0] == "all_reduce" and "barrier" in cfg.ops and len(cfg.ops) == 10
    assert cfg.libraries == ("ndist[socket]", "ndist[mpi]")
    cfg = parse_args(["broadcast", "--backend", "none", "--compare", "torch", "-d", "half", "-r", "1"])
    assert cfg.libraries == ("torch",) and cfg.dtype == "float16" and cfg.root == 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["all_reduc"], "all_reduc"),
        (["all_reduce", "-b", "1X"], "minbytes"),
        (["all_reduce", "-b", "1M", "-e", "1K"], "maxbytes"),
        (["all_reduce", "-d", "float8"], "datatype"),
        (["all_reduce", "-o", "xor"], "-o/--op"),
        (["all_reduce", "--compare", "nccl"], "compare"),
        (["all_reduce", "--backend", "gloo"], "backend"),
        (["all_reduce", "--backend", "none"], "--compare"),
        (["broadcast", "-r", "2", "--nproc", "2"], "root"),
        (["sendrecv", "--nproc", "1"], "sendrecv needs at least 2"),
        (["all_reduce", "--nproc", "0"], "nproc"),
        (["all_reduce", "-n", "0"], "iters"),
        (["all_reduce", "-n", "x"], "iters"),
        (["all_reduce", "--timeout", "0"], "timeout"),
    ],
)
def test_parse_args_rejects(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_import_is_lazy():
    import subprocess
    import sys

    code = ("import sys, ndist.bench; "
            "print(sorted(m for m in ('torch', 'mpi4py', 'matplotlib', 'cupy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
