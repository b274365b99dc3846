#!/usr/bin/env bash
# compute-sanitizer on the decode suites one test case per process, PAR processes at a time, so that a tool as slow as
# racecheck covers whole suites in one call (session 30: racecheck of a whole suite in one process passed 170 s in its
# second case). The cases are the suites' own TEST_CASE names, read from tests/cuda/ (a doctest filter is a wildcard
# pattern and a comma separates filters, so each name is cut at its first comma and ends in '*'); the skipped child
# case of test_decode_cuda is run by its parent.
# Run from the repository root on the device:
#   TOOL=racecheck LIB=lib_land PACK=.device/pack51.tar.xz PAR=10 TOTAL=560 bash experiments/bench/decode_2026-12-07/session31/sanitize_cases.sh
# -> $OUT/results.tar: r/<tool>_<suite>_<case>.txt per case, r/summary.txt (the sanitizer's summary line, doctest's
#    count and the exit status of every case; rc 124: stopped at the deadline).
source experiments/bench/decode_2026-12-05/device_common.sh
TOOL=${TOOL:-racecheck}; LIB=${LIB:-lib_land}; PAR=${PAR:-10}; TOTAL=${TOTAL:-560}
case $TOOL in memcheck) EXTRA="--leak-check full";; racecheck|initcheck|synccheck) EXTRA="";;
  *) echo "sanitize_cases.sh: TOOL must be memcheck, racecheck, initcheck or synccheck, got '$TOOL'" >&2; exit 2;; esac
unpack_pack ${PACK:-.device/pack51.tar.xz} $LIB
[ -d "$A/$LIB" ] || { echo "sanitize_cases.sh: the pack has no $LIB" >&2; exit 2; }
cat $A/bin/COMMIT > $R/pack_commit.txt; echo "$LIB" > $R/library.txt; cat $R/gpu.txt
for suite in test_decode_cuda test_decode_kda_cuda; do
  grep -o 'TEST_CASE("[^"]*")' tests/cuda/$suite.cpp | grep -v "child process" \
    | sed 's/TEST_CASE("//; s/")$//; s/,.*//; s/$/*/' | awk -v s=$suite '{ printf "%s|%02d|%s\n", s, NR, $0 }'
done > $R/cases.txt
echo "$(wc -l < $R/cases.txt) cases, $PAR at a time, $TOOL, $LIB"
# Every case stops by one deadline, TOTAL from the start (session 32: a per-case limit let cases that began late run past
# the call's limit, and the call was stopped before its summary was written).
export TOOL EXTRA B R DEADLINE=$(( $(date +%s) + TOTAL - SECONDS - 25 )) LD_LIBRARY_PATH=$A/$LIB$SYS
one_case() {
  local suite=${1%%|*} rest=${1#*|}; local n=${rest%%|*} pattern=${rest#*|} t0=$SECONDS left=$(( DEADLINE - $(date +%s) ))
  [ $left -lt 10 ] && { echo "$suite $n not run (no time left)"; return; }
  timeout $left compute-sanitizer --tool $TOOL $EXTRA $B/$suite -tc="$pattern" > $R/${TOOL}_${suite}_$n.txt 2>&1
  local rc=$?
  echo "$suite $n rc=$rc $((SECONDS - t0))s | $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $R/${TOOL}_${suite}_$n.txt | tr '\n' ' ')| $(grep -h 'test cases:' $R/${TOOL}_${suite}_$n.txt | tr -s ' ')"
}
export -f one_case
( while sleep 30; do snapshot_results; done ) & snapshots=$!  # what has run comes back even if the call is stopped
xargs -d '\n' -P $PAR -I{} bash -c 'one_case "$1"' _ {} < $R/cases.txt | tee $R/summary.txt  # each line as its case ends
sort -o $R/summary.txt $R/summary.txt
kill $snapshots; wait $snapshots 2>/dev/null
pack_results
