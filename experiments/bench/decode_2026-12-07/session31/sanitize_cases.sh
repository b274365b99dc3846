#!/usr/bin/env bash
# compute-sanitizer on the decode suites one test case per process, PAR processes at a time, so that a tool as slow as
# racecheck covers whole suites in one call (session 30: racecheck of a whole suite in one process passed 170 s in its
# second case). The cases are the suites' own TEST_CASE names, read from tests/cuda/ (a doctest filter is a wildcard
# pattern and a comma separates filters, so each name is cut at its first comma and ends in '*'); the skipped child
# case of test_decode_cuda is run by its parent.
# Run from the repository root on the device:
#   TOOL=racecheck LIB=lib_land PACK=.device/pack51.tar.xz PAR=10 TOTAL=560 bash experiments/bench/decode_2026-12-07/session31/sanitize_cases.sh
#   CASES="test_decode_cuda|02 test_decode_cuda|03 test_decode_cuda|07 test_decode_kda_cuda|05" SHARDS=4 TOOL=racecheck ... (the long cases, 16 processes)
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
done > $R/all_cases.txt
# CASES="suite|NN ..." runs only those cases (numbers as in all_cases.txt); unset, every case. SHARDS=N runs each of the
# cases whose configuration loops honour REPLAYSSM_TEST_SHARD (tests/test_util.h; SHARDABLE, session 32: the four
# that racecheck did not finish in 530 s) as N processes, shard i/N each; together they run the whole case.
SHARDABLE="test_decode_cuda|02 test_decode_cuda|03 test_decode_cuda|07 test_decode_kda_cuda|05"
SHARDS=${SHARDS:-1}
while IFS= read -r line; do
  id=${line%|*}
  [ -n "${CASES:-}" ] && [[ " $CASES " != *" $id "* ]] && continue
  if [ "$SHARDS" -gt 1 ] && [[ " $SHARDABLE " == *" $id "* ]]; then
    for ((i = 0; i < SHARDS; ++i)); do echo "$line|$i/$SHARDS"; done
  else
    echo "$line|"
  fi
done < $R/all_cases.txt > $R/cases.txt
[ -s $R/cases.txt ] || { echo "sanitize_cases.sh: CASES='${CASES:-}' selects none of $R/all_cases.txt" >&2; exit 2; }
echo "$(wc -l < $R/cases.txt) processes, $PAR at a time, $TOOL, $LIB"
# Every case stops by one deadline, TOTAL from the start (session 32: a per-case limit let cases that began late run past
# the call's limit, and the call was stopped before its summary was written).
export TOOL EXTRA B R DEADLINE=$(( $(date +%s) + TOTAL - SECONDS - 25 )) LD_LIBRARY_PATH=$A/$LIB$SYS
one_case() {
  local suite n pattern shard t0=$SECONDS left=$(( DEADLINE - $(date +%s) ))
  IFS='|' read -r suite n pattern shard <<< "$1"
  local name=$suite\ $n${shard:+ shard $shard} out=$R/${TOOL}_${suite}_$n${shard:+_s${shard%/*}}.txt
  [ $left -lt 10 ] && { echo "$name not run (no time left)"; return; }
  REPLAYSSM_TEST_SHARD=$shard timeout $left compute-sanitizer --tool $TOOL $EXTRA $B/$suite -tc="$pattern" > $out 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s | $(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" $out | tr '\n' ' ')| $(grep -h 'test cases:' $out | tr -s ' ')"
}
export -f one_case
( while sleep 30; do snapshot_results; done ) & snapshots=$!  # what has run comes back even if the call is stopped
xargs -d '\n' -P $PAR -I{} bash -c 'one_case "$1"' _ {} < $R/cases.txt | tee $R/summary.txt  # each line as its case ends
sort -o $R/summary.txt $R/summary.txt
kill $snapshots; wait $snapshots 2>/dev/null
pack_results
