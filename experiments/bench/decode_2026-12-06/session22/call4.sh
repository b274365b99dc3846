#!/usr/bin/env bash
# Session 22, call 4 (about TOTAL = 480 s): pack .device/pack25.tar.xz (make_pack25.sh). Rule in README.md ("Call 4").
# 1. On an H200 only: both suites and two record rounds of lib_g2 on every paper shape at B = 32 and 256.
# 2. A/B: lib_land and lib_g2 alternating, 3 rounds, Super and Nano at B = 16, 32, 64, 128, 256.
# 3. Nsight Compute SourceCounters on Qwen3.5-4B's FP8 read (lib_land, B = 256), source page per CUDA line.
# -> $OUT/results.tar. Run from the repository root: TOTAL=480 bash experiments/bench/decode_2026-12-06/session22/call4.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-480}
unpack_pack ${PACK:-.device/pack25.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_g2) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
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
  suite lib_g2 test_decode_cuda; suite lib_g2 test_decode_kda_cuda
  for round in 1 2; do
    bench lib_g2 "nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b" "32 256" record_lib_g2_$round
  done
fi
for round in 1 2 3; do
  for l in lib_land lib_g2; do
    [ $((TOTAL - SECONDS)) -lt 50 ] && { echo "$l round $round skipped (time)"; continue; }
    bench $l "nemotron-3-super nemotron-3-nano-4b" "16 32 64 128 256" ab_${l}_$round
  done
done
grep -h "non-flush read nvfp4" $R/ab_*_1.txt | cut -c1-130
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout -s INT $((TOTAL - SECONDS - 20)) ncu --clock-control none --kernel-name-base demangled \
  --print-kernel-base demangled -k "regex:replay_nonflush_kernel<.replayssm::ssm::Recurrence.1, .replayssm::formats::StorageFormat.5, .int.128, .bool.0, .bool.0" \
  --launch-skip 4 --launch-count 1 --section SourceCounters --section InstructionStats -o $R/qwen4b_fp8_source \
  $B/replayssm-bench bench --shapes qwen3.5-4b --batch 256 --window 16 --drafts 8 --repeats 3 --no-check --arena-gib 24 \
  > $R/qwen4b_fp8_source.log 2>&1
echo "ncu source rc=$? $((SECONDS-t0))s"
if [ -f $R/qwen4b_fp8_source.ncu-rep ]; then
  ncu -i $R/qwen4b_fp8_source.ncu-rep --page source --print-source cuda,sass --csv > $R/qwen4b_fp8_source_sass.csv 2> $R/qwen4b_fp8_source_sass.log
  echo "source page rc=$? $(wc -l < $R/qwen4b_fp8_source_sass.csv) lines"; rm $R/qwen4b_fp8_source.ncu-rep
fi
pack_results
