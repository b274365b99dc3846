#!/usr/bin/env bash
# Session 26, call 2 (about TOTAL = 200 s): compute-sanitizer on the list path, the cases call 1 missed. Call 1's
# synccheck filter held a comma, which doctest splits on, so it matched no test case. Pack .device/pack41.tar.xz.
#   synccheck and racecheck: the staggered replay case (the list check's block-wide vote, __syncthreads_or);
#   synccheck: the CUDA Graphs case (partial lists with device-resident parity);
#   memcheck: the ef/appendix F, after-verification and split-verification cases (each alternates list and no-list
#   steps). -> $OUT/results.tar.
# Run from the repository root: TOTAL=200 bash experiments/bench/decode_2026-12-06/session26/call2.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-200}
unpack_pack ${PACK:-.device/pack41.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
sanitize() {  # name tool filter seconds
  local t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 20 ] && { echo "$1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout $4 compute-sanitizer --tool $2 $B/test_decode_cuda -tc="$3" > $R/$1.txt 2>&1
  echo "$1 rc=$? $((SECONDS-t0))s $(grep 'test cases:' $R/$1.txt | tr -s ' ') $(tail -n 1 $R/$1.txt)"
}
sanitize synccheck_staggered synccheck "*split low-precision reads*staggered windows" 60
sanitize synccheck_graphs synccheck "CUDA Graphs:*" 60
sanitize memcheck_ef_skip memcheck "*error feedback and appendix F skipping*" 60
sanitize memcheck_after_verify memcheck "standard steps after verification commits*" 40
sanitize memcheck_split_verify memcheck "split-precision verification (Algorithm 3)*" 40
sanitize racecheck_staggered racecheck "*split low-precision reads*staggered windows" 90
pack_results
