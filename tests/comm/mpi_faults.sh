#!/usr/bin/env bash
# Failures across MPI processes, 20 runs of each: a rank killed by SIGKILL, a rank that stalls past
# the deadline, a rank that calls a mismatched collective (tests/comm/mpi_faults.cpp). Each run must
# end with a non-zero exit within the deadline plus 5 s (never hang), and every surviving rank must
# print a weft error naming world rank 1 and the operation with its sequence number.
# usage: mpi_faults.sh BINARY MPIRUN [ARGS...]
set -uo pipefail
bin=$1
shift
mpirun=("$@")
deadline_ms=2000
runs=${WEFT_FAULT_RUNS:-20}
fail=0
for mode in ${WEFT_FAULT_MODES:-kill stall mismatch}; do
  worst=0
  for ((i = 1; i <= runs; i++)); do
    start=$(date +%s%N)
    out=$(timeout 60 "${mpirun[@]}" --tag-output "$bin" "$mode" 1 "$deadline_ms" 2>&1)
    rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    ((ms > worst)) && worst=$ms
    if ((rc == 124)); then
      echo "FAIL $mode run $i: hung (killed after 60 s)"; fail=1; continue
    fi
    if ((rc == 0)); then
      echo "FAIL $mode run $i: exit status 0"; echo "$out"; fail=1; continue
    fi
    if ((ms > deadline_ms + 5000)); then
      echo "FAIL $mode run $i: took $ms ms (deadline $deadline_ms ms + 5 s)"; fail=1
    fi
    for r in 0 2 3; do
      line=$(grep -a "^\[1,$r\]<stderr>:weft error:" <<<"$out" | head -1)
      if ! grep -q "world rank 1" <<<"$line" || ! grep -Eq "(all_reduce|all_gather|barrier) #[0-9]+ on" <<<"$line"; then
        echo "FAIL $mode run $i: rank $r did not name world rank 1 and the operation:"
        grep -a "^\[1," <<<"$out" | cut -c1-400; fail=1
        break
      fi
    done
    if ((i == 1)); then
      echo "$mode: rank 0 printed: $(grep -a "^\[1,0\]<stderr>:weft error:" <<<"$out" | head -1 | cut -c1-400)"
    fi
  done
  echo "$mode: $runs runs, slowest $worst ms from start to exit (deadline $deadline_ms ms)"
done
exit $fail
