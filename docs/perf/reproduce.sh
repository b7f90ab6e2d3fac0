#!/bin/sh
# Re-run the measurements of docs/performance.md from the repository root:
#   sh docs/perf/reproduce.sh            (needs mpi4py + the mpich wheel, torch, matplotlib)
# Writes docs/perf/{sweep,targets,latency}_n{2,4}.{txt,json,md} and sweep_n{2,4}.png. docs/performance.md
# is written by hand from such runs: each section names its run's command, time and raw files.
set -e
PY=${PYTHON:-python}
OUT=docs/perf
for n in 2 4; do
  # The sweep: ndist (socket and MPI backends) against raw mpi4py + MPICH and torch + Gloo,
  # interleaved; 7 rounds per size and library, the least disturbed one reported.
  $PY -m ndist.bench all_reduce all_to_all -b 4K -e 64M -f 4 -n 20 -w 5 --rounds 7 --stat min --nproc $n \
      --backend socket,mpi --compare mpi4py,torch -q \
      --json $OUT/sweep_n$n.json --markdown $OUT/sweep_n$n.md --plot $OUT/sweep_n$n.png > $OUT/sweep_n$n.txt
  # The target sizes only (4 KiB, 64 KiB, 1 MiB, 16 MiB), more rounds.
  $PY -m ndist.bench all_reduce all_to_all -b 4K -e 16M -f 16 -n 20 -w 5 --rounds 11 --stat min --nproc $n \
      --backend socket,mpi --compare mpi4py,torch -q \
      --json $OUT/targets_n$n.json --markdown $OUT/targets_n$n.md > $OUT/targets_n$n.txt
  # The latency target (4 KiB) with enough iterations per round that one scheduler
  # hiccup does not decide it (20 calls take ~0.4 ms; 500 take ~10 ms).
  $PY -m ndist.bench all_reduce -b 4K -e 4K -n 500 -w 50 --rounds 11 --stat min --nproc $n \
      --backend socket,mpi --compare mpi4py,torch -q \
      --json $OUT/latency_n$n.json --markdown $OUT/latency_n$n.md > $OUT/latency_n$n.txt
done
