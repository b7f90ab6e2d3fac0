#!/usr/bin/env bash
# The whole GPU validation of ndist in one command, for a machine with one NVIDIA GPU.
#
#   bash tools/gpu_check.sh [OUTDIR]        (OUTDIR defaults to $OUT)
#
# Parts, each under its own `timeout` (seconds in TIMEOUT below), in this order:
#   versions       device, driver, CUDA runtime, CuPy, NCCL, MPI, Python packages
#   build          the native engine, built in place (setup.py build_ext --inplace)
#   seed           tests/gpu/test_cuda_semantics_seed.py (the CUDA-semantics seed page)
#   suite          the rest of tests/gpu, but for the files of the parts below
#   mpi            tests/gpu/test_mpi_cupy.py (CuPy arrays through the mpi backend)
#   example        examples/gpu_all_reduce.py under ndistrun, 1 rank
#   staging        tests/gpu/test_staging_cupy.py (socket backend, CUDA arrays, 2-4 ranks, 1 GPU)
#   ipc            tests/gpu/test_mp_cuda.py (CUDA IPC through ndist.multiprocessing)
#   nccl_bench     benchmarks/nccl_overhead.py (nccl enqueue at world size 1 vs raw CuPy NCCL)
#   graph_bench    benchmarks/nccl_graph.py (a CUDA graph of 100 all_reduces: ndist vs raw NCCL captured)
#   staging_bench  benchmarks/staging_overhead.py (pipelined host-staged socket all_reduce vs
#                  host + cudaMemcpy both ways)
# A failed or hung part does not stop the others. The whole run stays within
# NDIST_GPU_CHECK_BUDGET seconds (default 345): a part gets at most what is left, and one
# with under 5 s left is NOT RUN. A pytest part whose tests all skipped for reasons one
# GPU explains (more GPUs, no mpiexec) is SKIP, which is not a failure.
#
# Writes into OUTDIR (at most 6 files, so that all of them come back from the device tool):
#   report.md            one line per part (PASS / SKIP / FAIL / TIMEOUT / NOT RUN, seconds, note),
#                        versions, the benchmark tables, the tail of every failed part's log;
#                        rewritten after every part
#   junit.xml            the pytest parts' JUnit XML, merged
#   nccl_overhead.json, nccl_graph.json, staging_overhead.json   the benchmarks' numbers
#   logs.tar.gz          every part's full log and XML
# Exit status: 0 when every part passed, 1 otherwise, 2 for bad usage.
# Without an NVIDIA GPU it prints one line, writes nothing and exits 0.
#
# Environment:
#   PYTHON                    interpreter (default python3)
#   NDIST_GPU_CHECK_PARTS     the parts to run, space or comma separated (default: all)
#   NDIST_GPU_CHECK_TIMEOUTS  per-part timeouts, e.g. "suite=200,seed=60"
#   NDIST_GPU_CHECK_BUDGET    seconds for the whole run (default 345)
#   NDIST_GPU_CHECK_FORCE=1   run the parts even without a GPU (to check this script on a
#                             CPU machine: the GPU parts then fail, as they should)
# docs/gpu.md says how to run it on the device machine and what it reports.

# shellcheck disable=SC2317  # the check_* and *_cmd functions are called indirectly (run_part, bash -c)
set -u

ALL_PARTS="versions build seed suite mpi example staging ipc nccl_bench graph_bench staging_bench"
declare -A TIMEOUT=([versions]=20 [build]=45 [seed]=30 [suite]=100 [mpi]=30 [example]=30 [staging]=60
                    [ipc]=40 [nccl_bench]=40 [graph_bench]=30 [staging_bench]=40)

have_gpu() {
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        return 0
    fi
    compgen -G '/dev/nvidia[0-9]*' >/dev/null
}

if [ "${NDIST_GPU_CHECK_FORCE:-0}" != 1 ] && ! have_gpu; then
    echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi lists none, no /dev/nvidia*): nothing checked"
    exit 0
fi

OUTDIR=${1:-${OUT:-}}
if [ -z "$OUTDIR" ]; then
    echo "usage: bash tools/gpu_check.sh OUTDIR (or set OUT)" >&2
    exit 2
fi
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
BUDGET=${NDIST_GPU_CHECK_BUDGET:-345}
PARTS=${NDIST_GPU_CHECK_PARTS:-$ALL_PARTS}
PARTS=${PARTS//,/ }
for p in $PARTS; do
    if [ -z "${TIMEOUT[$p]+x}" ]; then
        echo "gpu_check: unknown part '$p' in NDIST_GPU_CHECK_PARTS; expected some of: $ALL_PARTS" >&2
        exit 2
    fi
done
if ! [[ "$BUDGET" =~ ^[0-9]+$ ]]; then
    echo "gpu_check: NDIST_GPU_CHECK_BUDGET: expected whole seconds; got '$BUDGET'" >&2
    exit 2
fi
TIMEOUTS=${NDIST_GPU_CHECK_TIMEOUTS:-}
for kv in ${TIMEOUTS//,/ }; do
    name=${kv%%=*}
    if [ -z "${TIMEOUT[$name]+x}" ] || ! [[ "$kv" =~ ^[a-z_]+=[0-9]+(\.[0-9]+)?$ ]]; then
        echo "gpu_check: bad entry '$kv' in NDIST_GPU_CHECK_TIMEOUTS; expected PART=SECONDS, PART one of: $ALL_PARTS" >&2
        exit 2
    fi
    TIMEOUT[$name]=${kv#*=}
done

mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ndist-gpu-check.XXXXXX") || exit 2
CURRENT_PGID=
on_exit() {  # also when the script itself is stopped: the running part's processes go too
    if [ -n "$CURRENT_PGID" ]; then kill -KILL -- "-$CURRENT_PGID" 2>/dev/null; fi
    rm -rf "$WORK"
}
trap on_exit EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM
cd "$ROOT" || exit 2
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
START=$(date +%s)
FAILED=0
: >"$WORK/parts.tsv"
rm -f "$OUTDIR/report.md" "$OUTDIR/junit.xml" "$OUTDIR/nccl_overhead.json" "$OUTDIR/nccl_graph.json" \
      "$OUTDIR/staging_overhead.json" "$OUTDIR/logs.tar.gz"

# ------------------------------------------------------------------ the report
section_file() {  # title, file: a fenced block of the file, if it exists
    [ -s "$2" ] || return 0
    printf '\n## %s\n\n```\n' "$1"
    cat "$2"
    printf '```\n'
}

# The commit the checkout is at, and how many tracked files differ from it: a copy of a
# working tree (the device tool's) may carry changes not committed, or git metadata older
# than its files; the bare commit alone would name code that did not run.
checkout_line() {
    local head changed
    head=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) || { echo '?'; return; }
    changed=$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
    if [ "$changed" -gt 0 ]; then
        echo "$head + $changed tracked file(s) changed since it"
    else
        echo "$head"
    fi
}
CHECKOUT=$(checkout_line)  # (before the parts: the build adds files, untracked ones)

write_report() {
    {
        echo "# ndist GPU check"
        echo
        echo "$(date -u '+%Y-%m-%d %H:%M:%S UTC'), host ${HOSTNAME:-$(uname -n)}, checkout $CHECKOUT, $(( $(date +%s) - START )) s so far, budget ${BUDGET} s"
        echo
        echo "| part | result | seconds | timeout | note |"
        echo "|------|--------|---------|---------|------|"
        while IFS=$'\t' read -r name status secs limit note; do
            echo "| $name | $status | $secs | $limit | ${note//|/\\|} |"
        done <"$WORK/parts.tsv"
        section_file "Versions" "$WORK/versions.log"
        section_file "NCCL at world size 1: ndist vs raw CuPy NCCL" "$WORK/nccl_bench.table"
        section_file "A CUDA graph of all_reduces: ndist vs raw NCCL" "$WORK/graph_bench.table"
        section_file "Host-staged socket all_reduce vs cudaMemcpy" "$WORK/staging_bench.table"
        while IFS=$'\t' read -r name status secs limit note; do
            case $status in PASS | SKIP | "NOT RUN") continue ;; esac
            printf '\n## %s: %s (last 60 lines of its log)\n\n```\n' "$name" "$status"
            tail -n 60 "$WORK/$name.log" 2>/dev/null
            printf '```\n'
        done <"$WORK/parts.tsv"
    } >"$OUTDIR/report.md.tmp" && mv "$OUTDIR/report.md.tmp" "$OUTDIR/report.md"
    tar -czf "$OUTDIR/logs.tar.gz.tmp" -C "$WORK" . 2>/dev/null && mv "$OUTDIR/logs.tar.gz.tmp" "$OUTDIR/logs.tar.gz"
}

# ------------------------------------------------------------------ running parts
group_members() {  # PGID: the pids of the live processes of that process group (from /proc)
    local f stat state pgrp
    for f in /proc/[0-9]*/stat; do
        { read -r stat <"$f"; } 2>/dev/null || continue
        read -r state _ pgrp _ <<<"${stat##*) }"
        [ "$pgrp" = "$1" ] && [ "$state" != Z ] && echo "${f//[^0-9]/}"
    done
}

# run_part NAME CHECK CMD...: runs CMD under timeout into WORK/NAME.log; CHECK is a
# function called as CHECK NAME RC that prints "STATUS<TAB>note" for a finished part.
run_part() {
    local name=$1 check=$2
    shift 2
    local left=$(( BUDGET - ($(date +%s) - START) ))
    local limit=${TIMEOUT[$name]}
    if [ "$left" -lt 5 ]; then
        printf '%s\tNOT RUN\t0\t%s\tthe %s s budget was spent\n' "$name" "$limit" "$BUDGET" >>"$WORK/parts.tsv"
        FAILED=1
        write_report
        return
    fi
    # a part gets at most the budget that is left (integer seconds; fractions stay as given)
    if [[ "$limit" =~ ^[0-9]+$ ]] && [ "$limit" -gt "$left" ]; then limit=$left; fi
    echo "== $name (timeout ${limit} s): $*" >&2
    local t0 rc status note result left_over=0
    t0=$(date +%s.%N)
    # SIGINT, once, to the part's main process: pytest then still writes its JUnit XML and
    # Python prints where it hung; KILL 10 s later. setsid puts the part in a process group of
    # its own, so that whatever it leaves running is swept away before the next part.
    if command -v setsid >/dev/null 2>&1; then
        setsid timeout --foreground -s INT -k 10 "$limit" "$@" >"$WORK/$name.log" 2>&1 </dev/null &
        local pid=$!
        CURRENT_PGID=$pid
        wait "$pid"
        rc=$?
        left_over=$(group_members "$pid" | wc -l)
        [ "$left_over" -gt 0 ] && kill -KILL -- "-$pid" 2>/dev/null
        CURRENT_PGID=
    else
        timeout -s INT -k 10 "$limit" "$@" >"$WORK/$name.log" 2>&1 </dev/null
        rc=$?
    fi
    local secs
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        status=TIMEOUT
        note="killed after ${limit} s; its last line: $(grep -v '^\s*$' "$WORK/$name.log" | tail -n 1 | cut -c1-200)"
    else
        result=$("$check" "$name" "$rc")
        status=${result%%$'\t'*}
        note=${result#*$'\t'}
    fi
    if [ "$left_over" -gt 0 ]; then
        note="$note; left $left_over process(es) running (killed)"
    fi
    [ "$status" = PASS ] || [ "$status" = SKIP ] || FAILED=1
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "$limit" "$note" >>"$WORK/parts.tsv"
    echo "   $name: $status in ${secs} s: $note" >&2
    write_report
}

check_versions() {  # PASS iff nothing the checks need is missing
    if [ "$2" = 0 ]; then
        printf 'PASS\t%s\n' "$(grep -m1 -E '^cuda:0 ' "$WORK/$1.log" | cut -c1-200)"
    else
        printf 'FAIL\texit %s: %s\n' "$2" "$( (grep -m1 '^MISSING' "$WORK/$1.log" || tail -n 1 "$WORK/$1.log") | cut -c1-200)"
    fi
}

check_build() {  # the native engine was built and imports; else ndist runs its Python engine
    if [ "$2" = 0 ]; then
        printf 'PASS\tnative engine built\n'
    else
        printf 'FAIL\texit %s: %s\n' "$2" "$( (grep -m1 'WARNING: ndist' "$WORK/$1.log" || tail -n 1 "$WORK/$1.log") | cut -c1-250)"
    fi
}

check_pytest() {  # PASS iff exit 0, a test passed and only skips that one GPU explains (gpu_check_helper.py)
    "$PY" "$ROOT/tools/gpu_check_helper.py" verdict "$WORK/$1.xml" "$2" 2>&1 || printf 'FAIL\thelper failed\n'
}

check_example() {  # rank 0 prints OK (ndistrun prefixes its lines with [rank0]:)
    if [ "$2" = 0 ] && grep -qE '(^|:)OK$' "$WORK/$1.log"; then
        printf 'PASS\t%s\n' "$(grep -m1 -o 'backend .*' "$WORK/$1.log")"
    else
        printf 'FAIL\texit %s: %s\n' "$2" "$(grep -v '^\s*$' "$WORK/$1.log" | tail -n 1 | cut -c1-200)"
    fi
}

check_bench() {  # exit 0 and its verdict line; the table goes into the report
    local marker=$3
    grep -v '^==' "$WORK/$1.log" | grep -E '^ *[0-9]|^#|^ *bytes|^ *(graph|raw|ndist) ' >"$WORK/$1.table"
    if [ "$2" = 0 ] && grep -q "^# $marker" "$WORK/$1.log"; then
        printf 'PASS\t%s\n' "$(grep -m1 -E '^# (per-call|graph replay|target)' "$WORK/$1.log" || echo "$marker")"
    elif [ "$2" = 1 ] && grep -q '^# FAIL' "$WORK/$1.log"; then
        printf 'FAIL\t%s\n' "$(grep -m1 '^# FAIL' "$WORK/$1.log")"
    else
        printf 'FAIL\texit %s: %s\n' "$2" "$(grep -v '^\s*$' "$WORK/$1.log" | tail -n 1 | cut -c1-200)"
    fi
}
check_nccl_bench() { check_bench "$1" "$2" PASS; }
check_graph_bench() { check_bench "$1" "$2" PASS; }
check_staging_bench() { check_bench "$1" "$2" OK; }

pytest_part() {  # NAME TESTS...: pytest with JUnit XML, verbose (a hang shows the test that hung)
    local name=$1
    shift
    if ! "$PY" -c 'import pytest' >/dev/null 2>&1; then
        printf '%s\tFAIL\t0\t%s\tpytest is not installed for %s: carry a wheel (docs/gpu.md)\n' \
            "$name" "${TIMEOUT[$name]}" "$PY" >>"$WORK/parts.tsv"
        FAILED=1
        write_report
        return
    fi
    run_part "$name" check_pytest "$PY" -m pytest -v -rfEs -p no:cacheprovider \
        --junitxml="$WORK/$name.xml" -o junit_suite_name="$name" "$@"
}

versions_cmd() {
    echo "uname: $(uname -srm)"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 \
            | sed 's/^/nvidia-smi: /'
    else
        echo "nvidia-smi: not on PATH"
    fi
    "$PY" "$ROOT/tools/gpu_check_helper.py" versions
}

build_cmd() {
    "$PY" setup.py -q build_ext --inplace || return 1
    "$PY" -c 'import ndist.collectives.backends.socket.native._cnative, ndist.collectives._crun; print("native engine built")'
}
export -f versions_cmd build_cmd
export PY ROOT

# ------------------------------------------------------------------ the parts
for part in $PARTS; do
    case $part in
        versions) run_part versions check_versions bash -c versions_cmd ;;
        build) run_part build check_build bash -c build_cmd ;;
        seed) pytest_part seed tests/gpu/test_cuda_semantics_seed.py ;;
        suite) pytest_part suite tests/gpu --ignore=tests/gpu/test_cuda_semantics_seed.py \
                   --ignore=tests/gpu/test_staging_cupy.py --ignore=tests/gpu/test_mp_cuda.py \
                   --ignore=tests/gpu/test_mpi_cupy.py ;;
        mpi) pytest_part mpi tests/gpu/test_mpi_cupy.py ;;
        example) run_part example check_example "$PY" -m ndist.launch --nproc-per-node 1 examples/gpu_all_reduce.py ;;
        staging) pytest_part staging tests/gpu/test_staging_cupy.py ;;
        ipc) pytest_part ipc tests/gpu/test_mp_cuda.py ;;
        nccl_bench) run_part nccl_bench check_nccl_bench "$PY" benchmarks/nccl_overhead.py --breakdown \
                        --json "$OUTDIR/nccl_overhead.json" ;;
        graph_bench) run_part graph_bench check_graph_bench "$PY" benchmarks/nccl_graph.py \
                         --json "$OUTDIR/nccl_graph.json" ;;
        staging_bench) run_part staging_bench check_staging_bench "$PY" benchmarks/staging_overhead.py \
                           --nproc 2 --json "$OUTDIR/staging_overhead.json" ;;
    esac
done

xmls=()
for part in $PARTS; do  # in the order the parts ran
    [ -f "$WORK/$part.xml" ] && xmls+=("$WORK/$part.xml")
done
if [ "${#xmls[@]}" -gt 0 ]; then
    "$PY" "$ROOT/tools/gpu_check_helper.py" merge "$OUTDIR/junit.xml" "${xmls[@]}" >>"$WORK/merge.log" 2>&1
fi
write_report
cat "$OUTDIR/report.md"
exit "$FAILED"
