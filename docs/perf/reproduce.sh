#!/bin/sh
# Re-run the one-host measurements of docs/performance.md from the repository root, with
# nothing else running on the machine:
#   sh docs/perf/reproduce.sh [TAG]      (needs mpi4py + the mpich wheel, torch; TAG: file prefix)
# Writes docs/perf/TAG_{n2,n4,torch,n8,n16}.{txt,json}, TAG_b2b.txt, TAG_mpi_overhead.txt and
# TAG_copy_floor.txt, then collects the n = 2, n = 4 and torch runs into
# docs/perf/results/{one_host,torch}.json (docs/perf/collect.py) and regenerates the results
# section of docs/performance.md (docs/perf/render.py). Every table quotes the median of 5
# rounds. Add a line for the run to docs/perf/README.md.
set -e
START=$(date -u +%H:%M)
PY=${PYTHON:-python}
BIN=$(dirname "$(command -v "$PY")")
TAG=${1:-run}
OUT=docs/perf
OPS="all_reduce all_to_all all_gather reduce_scatter broadcast barrier"
for n in 2 4; do
  # every op, ndist (socket and MPI backends) against raw mpi4py + MPICH and torch + Gloo,
  # interleaved: for each size, each round measures every library once, in rotating order
  $PY -m ndist.bench $OPS -b 4K -e 16M -f 4 -n 20 -w 5 --rounds 5 --nproc $n \
      --backend socket,mpi --compare mpi4py,torch -q --json $OUT/${TAG}_n$n.json > $OUT/${TAG}_n$n.txt
done
# torch.distributed on backend "ndist" against torch.distributed on Gloo
$PY -m ndist.bench all_reduce all_to_all all_gather reduce_scatter -b 4K -e 16M -f 4 -n 20 -w 5 --rounds 5 \
    --nproc 2 --backend socket --compare torch,torch:ndist -q --json $OUT/${TAG}_torch.json > $OUT/${TAG}_torch.txt
# back to back: 2000 blocking 4 KiB calls after 200, the slowest rank's us per call
for i in 1 2; do
  $BIN/ndistrun --nproc-per-node 2 benchmarks/b2b_loop.py ndist ar,a2a,bc,bar 2000 | grep us/call
  $BIN/mpiexec -n 2 $PY benchmarks/b2b_loop.py mpi4py ar,a2a,bc,bar 2000 | grep us/call
  NDIST_ENGINE=python $BIN/ndistrun --nproc-per-node 2 benchmarks/b2b_loop.py ndist ar,a2a,bc,bar 1000 | grep us/call
done > $OUT/${TAG}_b2b.txt
# the mpi backend against raw mpi4py, interleaved call by call (4 KiB to 16 MiB)
$BIN/mpiexec -n 2 $PY benchmarks/mpi_overhead.py --sizes-mib 0.00390625 0.015625 0.0625 0.25 1 4 16 --iters 40 \
    > $OUT/${TAG}_mpi_overhead.txt
# what no shared-memory implementation can beat at 16 MiB
for op in all_to_all broadcast; do for n in 2 4; do
  $PY benchmarks/copy_floor.py --op $op --nproc $n --bytes 16777216 --rounds 7
done; done > $OUT/${TAG}_copy_floor.txt
# more ranks than cores (the targets' n = 8 and 16 row)
for n in 8 16; do
  $PY -m ndist.bench all_reduce all_to_all -b 4K -e 1M -f 256 -n 20 -w 5 --rounds 5 --nproc $n \
      --compare mpi4py -q --json $OUT/${TAG}_n$n.json > $OUT/${TAG}_n$n.txt
done
# the committed data the page is generated from; CONDITIONS says what else ran
WHEN="--date $(date -u +%Y-%m-%d) --time $START-$(date -u +%H:%M) --commit $(git rev-parse --short HEAD)"
$PY docs/perf/collect.py one_host $WHEN --conditions "${CONDITIONS:-nothing else on the machine}" \
    $OUT/${TAG}_n2.txt $OUT/${TAG}_n4.txt
$PY docs/perf/collect.py torch $WHEN --conditions "${CONDITIONS:-nothing else on the machine}" $OUT/${TAG}_torch.txt
$PY docs/perf/render.py
