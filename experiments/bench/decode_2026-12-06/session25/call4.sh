#!/usr/bin/env bash
# Session 25, call 4 (about TOTAL = 330 s): pack .device/pack41.tar.xz (make_pack41.sh; main with the flush list).
# 1. compute-sanitizer memcheck on the replay and CUDA Graphs cases (lists, partial lists with device-resident
#    parity), synccheck on the staggered replay cases (the list check's block-wide vote).
# 2. The run of record with flush lists (the bench's default): every paper shape at B = 32 and 256, checked before
#    timing, 2 rounds. -> $OUT/results.tar.
# Run from the repository root: TOTAL=330 bash experiments/bench/decode_2026-12-06/session25/call4.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-330}
unpack_pack ${PACK:-.device/pack41.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 120 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*ReplaySSM decode kernels equal*,*CUDA Graphs*" > $R/memcheck.txt 2>&1
echo "memcheck rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck.txt)"
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 60 compute-sanitizer --tool synccheck $B/test_decode_cuda \
  -tc="*shared fp32 and split low-precision reads, staggered windows*" > $R/synccheck.txt 2>&1
echo "synccheck rc=$? $((SECONDS-t0))s $(tail -n 1 $R/synccheck.txt)"
for round in 1 2; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "record round $round skipped (time)"; continue; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout 150 $B/replayssm-bench bench \
    --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 \
    --window 16 --drafts 8 --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
  echo "record round $round rc=$? $((SECONDS-t0))s"
done
grep -h "non-flush read\|staggered" $R/record_1.txt | grep "|  256 |" | cut -c1-130
pack_results
