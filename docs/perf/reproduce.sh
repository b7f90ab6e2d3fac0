#!/bin/sh
# Re-run the measurements of docs/performance.md from the repository root:
#   sh docs/perf/reproduce.sh            (needs mpi4py + the mpich wheel, torch, matplotlib)
# Writes docs/perf/{targets,anchors}_n{2,4}.{txt,json,md,png}; paste the .md tables into
# docs/performance.md together with the header lines of the .txt files.
set -e
PY=${PYTHON:-python}
OUT=docs/perf
for n in 2 4; do
  # ndist (socket and MPI backends) against raw mpi4py + MPICH and torch + Gloo, interleaved
  $PY -m ndist.bench all_reduce all_to_all -b 4K -e 64M -f 4 -n 20 -w 5 --rounds 5 --nproc $n \
      --backend socket,mpi --compare mpi4py,torch -q \
      --json $OUT/targets_n$n.json --markdown $OUT/targets_n$n.md --plot $OUT/targets_n$n.png \
      > $OUT/targets_n$n.txt
done
