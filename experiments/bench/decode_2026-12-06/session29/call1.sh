#!/usr/bin/env bash
# Session 29, call 1 (about TOTAL = 590 s): H4's A/B and the run of record in one call (one machine start: this
# session's first five calls got no machine). Pack .device/pack49.tar.xz (session 28's make_pack_arm.sh at d0a029d:
# lib_land = main's library, lib_h4 = main + vals_bf16_nvfp4_widen.patch) and .device/peers_slim.tar.xz.
#  1. test_decode_cuda on lib_h4; three alternating A/B rounds (session 28's call4.sh steps, the same bench command).
#  2. H4's rule (README.md, written in session 28 before any run) applied on the device by judge_h.py, so that the
#     record runs on the library the rule picks: LIB = lib_h4 if H4 lands, else lib_land.
#  3. On LIB: test_decode_cuda (lib_land only: lib_h4's ran in step 1), test_decode_kda_cuda, test_formats_cuda;
#     a checked record round (every paper shape, B = 32 and 256); the peers graph-timed; then, time allowing,
#     B = 8-128 and a second record round.
# With LIB set (lib_land or the arm) the call skips steps 1-2 and runs the record alone on that library.
# Another arm (session 30's H5): ARM=lib_h5 PACK=.device/pack50.tar.xz A_MODEL=nemotron-3-nano-4b (judge_h.py --a-model);
# session 31's H6: ARM=lib_h6 PACK=.device/pack51.tar.xz A_ROWS=skipping (judge_h.py --a-rows).
# -> $OUT/results.tar. Judge: judge_h.py --arm lib_h4 r; decode_targets.py r/record_*.csv.xz [r/other_batches.csv.xz]
#    --peers r/peers_*.csv.xz. Run from the repository root: TOTAL=590 bash experiments/bench/decode_2026-12-06/session29/call1.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-590}
ARM=${ARM:-lib_h4}
A_MODEL=${A_MODEL:-}  # judge_h.py --a-model (its default: Super); not with A_ROWS=skipping
# The suite that must pass on the arm before it can land: the one that runs its change (session 39's H10, a KDA kernel:
# ARM_SUITE=test_decode_kda_cuda).
ARM_SUITE=${ARM_SUITE:-test_decode_cuda}
RECORD_ONLY=${LIB:+1}
# LIB: a record alone, on any library the pack holds (checked below); session 34's call 3 asked for lib_h8b without
# ARM and was refused by the check this replaces, which knew lib_land and ARM only.
unpack_pack ${PACK:-.device/pack49.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
if [ -n "$RECORD_ONLY" ]; then NEEDS=$LIB; else NEEDS="lib_land $ARM"; fi  # a record alone needs only its library
for l in $NEEDS; do [ -d "$A/$l" ] || { echo "call1.sh: ${PACK:-.device/pack49.tar.xz} holds $(ls -d $A/lib_* | xargs -n1 basename | tr '\n' ' '), not $l" >&2; exit 2; }; done
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
if [ -z "$RECORD_ONLY" ]; then
  t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $ARM) timeout 100 $B/$ARM_SUITE > $R/${ARM_SUITE}_${ARM#lib_}.txt 2>&1
  arm_test=$?; echo "$ARM_SUITE ($ARM) rc=$arm_test $((SECONDS-t0))s"; tail -n 2 $R/${ARM_SUITE}_${ARM#lib_}.txt
  ab_rounds $ARM
  J=$(mktemp -d); for f in $R/ab_*.csv; do xz -c $f > $J/$(basename $f).xz; done
  python3 experiments/bench/decode_2026-12-06/session28/judge_h.py --arm $ARM ${A_MODEL:+--a-model $A_MODEL} --a-rows ${A_ROWS:-read} $J > $R/judge_device.txt 2>&1; cat $R/judge_device.txt
  LIB=lib_land; [ $arm_test = 0 ] && grep -q "^H LANDS" $R/judge_device.txt && LIB=$ARM
  snapshot_results
fi
echo "$LIB" > $R/library.txt; echo "record library: $LIB"
LD_LIBRARY_PATH=$(lib $LIB) $B/replayssm-bench --version > $R/version.txt 2>&1
# Every suite on the record's library, but the one the arm already passed in step 1.
suites="test_decode_cuda test_decode_kda_cuda test_formats_cuda"
[ -z "$RECORD_ONLY" ] && [ $LIB = "$ARM" ] && suites=$(echo $suites | tr ' ' '\n' | grep -vx "$ARM_SUITE" | tr '\n' ' ')
# LAND_EXCLUDE: test cases (a doctest -tce pattern) that only the arm's library serves, left out when main's library runs
# the suites (session 32's H7 adds a case for blocks that main's launcher refuses).
for suite in $suites; do t0=$SECONDS
  exclude=(); [ $LIB = lib_land ] && [ -n "${LAND_EXCLUDE:-}" ] && exclude=(-tce="$LAND_EXCLUDE")
  LD_LIBRARY_PATH=$(lib $LIB) timeout 120 $B/$suite "${exclude[@]}" > $R/$suite.txt 2>&1
  echo "$suite rc=$? $((SECONDS-t0))s $(grep 'test cases:' $R/$suite.txt | tr -s ' ')"
done
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
record() {  # round
  local t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 100 ] && { echo "record round $1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib $LIB) timeout $((TOTAL - SECONDS - 20 < 150 ? TOTAL - SECONDS - 20 : 150)) $B/replayssm-bench bench \
    --shapes $ALL --batch 32 256 --window 16 --drafts 8 --csv $R/record_$1.csv > $R/record_$1.txt 2>&1
  echo "record round $1 rc=$? $((SECONDS-t0))s"
}
record 1
snapshot_results
grep -h "non-flush read\|staggered" $R/record_1.txt | grep "|  256 |" | cut -c1-130
run_peers $((SECONDS + 200 < TOTAL ? SECONDS + 200 : TOTAL - 10))
snapshot_results
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 130 ] && { LD_LIBRARY_PATH=$(lib $LIB) timeout $((TOTAL - SECONDS - 20 < 120 ? TOTAL - SECONDS - 20 : 120)) \
  $B/replayssm-bench bench --shapes $ALL --batch 8 16 64 128 --window 16 --drafts 8 --csv $R/other_batches.csv \
  > $R/other_batches.txt 2>&1; echo "other batches rc=$? $((SECONDS-t0))s"; }
record 2
pack_results
