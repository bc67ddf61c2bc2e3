#!/usr/bin/env bash
# Failures across MPI processes, 20 runs of each: a rank killed by SIGKILL, a rank that stalls past
# the deadline, a rank that calls a mismatched collective (tests/comm/mpi_faults.cpp). Each run must
# end with a non-zero exit (never hang: 60 s), every surviving rank must print a weft error naming
# world rank 1 with the cause of the mode (an exit, a missed deadline, a mismatched call) and the
# operation with its sequence number, and the last of those reports must come within the deadline
# plus 5 s of the fault. The time is measured from the fault, which the failing rank prints, to the
# reports, which each rank prints (system clock, shared by the processes of one machine): mpirun's
# start-up and a loaded machine's slow process launch are not counted, so CTest may run other tests
# beside this one.
# usage: mpi_faults.sh BINARY MPIRUN [ARGS...]
set -uo pipefail
bin=$1
shift
mpirun=("$@")
deadline_ms=2000
margin_ms=5000
runs=${WEFT_FAULT_RUNS:-20}
fail=0
for mode in ${WEFT_FAULT_MODES:-kill stall mismatch}; do
  case $mode in
    kill) cause="world rank 1 \(pid [0-9]+ on this machine\) has exited" ;;
    stall) cause="world rank 1 did not reach (all_reduce|all_gather) #[0-9]+ on .* within the $deadline_ms ms deadline" ;;
    mismatch) cause="mismatched collective #[0-9]+ on .*world rank 1 called all_gather" ;;
    *) echo "FAIL: unknown mode $mode"; exit 1 ;;
  esac
  worst=0
  for ((i = 1; i <= runs; i++)); do
    out=$(timeout 60 "${mpirun[@]}" --tag-output "$bin" "$mode" 1 "$deadline_ms" 2>&1)
    rc=$?
    if ((rc == 124)); then
      echo "FAIL $mode run $i: hung (killed after 60 s)"; fail=1; continue
    fi
    if ((rc == 0)); then
      echo "FAIL $mode run $i: exit status 0"; echo "$out"; fail=1; continue
    fi
    fault=$(grep -a "^\[1,1\]<stderr>:mpi_faults: fault at " <<<"$out" | head -1 | awk '{print $NF}')
    if [ -z "$fault" ]; then
      echo "FAIL $mode run $i: rank 1 did not print its fault:"; grep -a "^\[1," <<<"$out" | cut -c1-400; fail=1; continue
    fi
    last=0
    for r in 0 2 3; do
      line=$(grep -a "^\[1,$r\]<stderr>:weft error:" <<<"$out" | head -1)
      if ! grep -Eq "$cause" <<<"$line" || ! grep -Eq "(all_reduce|all_gather|barrier) #[0-9]+ on" <<<"$line"; then
        echo "FAIL $mode run $i: rank $r did not name world rank 1 with the $mode cause and the operation:"
        grep -a "^\[1," <<<"$out" | cut -c1-400; fail=1
        break
      fi
      at=$(grep -a "^\[1,$r\]<stderr>:mpi_faults: error at " <<<"$out" | head -1 | awk '{print $NF}')
      if [ -z "$at" ]; then
        echo "FAIL $mode run $i: rank $r did not print when it caught its error"; fail=1; break
      fi
      ((at > last)) && last=$at
    done
    ms=$((last - fault))
    ((ms > worst)) && worst=$ms
    if ((ms > deadline_ms + margin_ms)); then
      echo "FAIL $mode run $i: the last report came $ms ms after the fault (deadline $deadline_ms ms + $margin_ms ms)"; fail=1
    fi
    if ((i == 1)); then
      echo "$mode: rank 0 printed: $(grep -a "^\[1,0\]<stderr>:weft error:" <<<"$out" | head -1 | cut -c1-400)"
    fi
  done
  echo "$mode: $runs runs, slowest $worst ms from the fault to the last report (deadline $deadline_ms ms)"
done
exit $fail
