#!/usr/bin/env bash
# Session 23, call 2 (about TOTAL = 400 s): pack .device/pack29.tar.xz (make_pack29.sh), after call 1 (neither FP8
# tensor-core variant qualified; README.md).
# 1. Nsight Compute, B = 256: the FP8 read's non-flush kernel of lib_land (CUDA cores) and lib_f8a (tensor cores),
#    Qwen3.5-4B (GDN) and Nemotron-3-Super (Mamba-2): why fewer instructions did not make it faster.
# 2. The run of record of main (lib_land, 95ebb60): every paper shape at B = 32 and 256, 2 rounds.
# -> $OUT/results.tar. Run from the repository root: TOTAL=400 bash experiments/bench/decode_2026-12-06/session23/call2.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-400}
unpack_pack ${PACK:-.device/pack29.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum
profile() {  # name library shape recurrence tensor-cores(0/1)
  local t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 40 ] && { echo "ncu $1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib $2) timeout -s INT $((TOTAL - SECONDS - 15)) ncu --clock-control none --kernel-name-base demangled \
    --print-kernel-base demangled \
    -k "regex:replay_nonflush_kernel<.replayssm::ssm::Recurrence.$4, .replayssm::formats::StorageFormat.5, .int.128, .bool.0, .bool.$5" \
    --launch-skip 4 --launch-count 2 $SECTIONS --metrics $EXTRA --csv --page raw --print-units base \
    $B/replayssm-bench bench --shapes $3 --batch 256 --window 16 --drafts 8 --repeats 3 --no-check --arena-gib 24 \
    > $R/ncu_$1.out 2> $R/ncu_$1.log
  echo "ncu $1 rc=$? $((SECONDS-t0))s"
}
profile qwen4b_fp8_land lib_land qwen3.5-4b 1 0
profile qwen4b_fp8_f8a lib_f8a qwen3.5-4b 1 1
profile super_fp8_land lib_land nemotron-3-super 0 0
profile super_fp8_f8a lib_f8a nemotron-3-super 0 1
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
for round in 1 2; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "record round $round skipped (time)"; continue; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout 150 $B/replayssm-bench bench \
    --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 \
    --window 16 --drafts 8 --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
  echo "record round $round rc=$? $((SECONDS-t0))s"
done
pack_results
