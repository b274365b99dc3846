#!/usr/bin/env bash
# Session 22, call 5 (about TOTAL = 420 s): pack .device/pack25.tar.xz (make_pack25.sh). Rule in README.md ("Call 5").
# 1. On an H200 only: both suites and two record rounds of lib_land (main) on every paper shape at B = 32 and 256.
# 2. A/B: lib_land and lib_g alternating, 3 rounds, Super and Nano at B = 128 and 256.
# 3. Nsight Compute on Kimi Linear's FP8 and FP32 non-flush reads at B = 256 (lib_land).
# -> $OUT/results.tar. Run from the repository root: TOTAL=420 bash experiments/bench/decode_2026-12-06/session22/call5.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-420}
unpack_pack ${PACK:-.device/pack25.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 200 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
bench() {  # library shapes batches name
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 150 $B/replayssm-bench bench --shapes $2 --batch $3 --window 16 --drafts 8 \
    --csv $R/$4.csv > $R/$4.txt 2>&1
  echo "$4 rc=$? $((SECONDS-t0))s"
}
if grep -q H200 $R/gpu.txt; then
  suite lib_land test_decode_cuda; suite lib_land test_decode_kda_cuda
  for round in 1 2; do
    bench lib_land "nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b" "32 256" record_lib_land_$round
  done
fi
for round in 1 2 3; do
  for l in lib_land lib_g; do
    [ $((TOTAL - SECONDS)) -lt 50 ] && { echo "$l round $round skipped (time)"; continue; }
    bench $l "nemotron-3-super nemotron-3-nano-4b" "128 256" ab_${l}_$round
  done
done
grep -h "non-flush read nvfp4" $R/ab_*_1.txt | cut -c1-130
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum
profile() {  # name shape kernel-regex skip count
  local t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 40 ] && { echo "ncu $1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout -s INT $((TOTAL - SECONDS - 15)) ncu --clock-control none --kernel-name-base demangled \
    --print-kernel-base demangled -k "regex:$3" --launch-skip $4 --launch-count $5 $SECTIONS --metrics $EXTRA --csv \
    --page raw --print-units base $B/replayssm-bench bench --shapes $2 --batch 256 --window 16 --drafts 8 --repeats 3 \
    --no-check --arena-gib 24 > $R/ncu_$1.out 2> $R/ncu_$1.log
  echo "ncu $1 ($2, launches $4+$5) rc=$? $((SECONDS-t0))s"
}
profile kimi_fp8_read kimi-linear-48b-a3b "kda_nonflush_kernel<.replayssm::formats::StorageFormat.5, .int.128>" 4 2
profile kimi_fp32_read kimi-linear-48b-a3b "kda_nonflush_kernel<.replayssm::formats::StorageFormat.0, .int.128>" 4 2
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
pack_results
