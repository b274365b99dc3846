#!/usr/bin/env bash
# Session 28, call 2 (about TOTAL = 480 s): Nsight Compute on what issue 13's done-when still asks for, pack
# .device/pack45.tar.xz (main's library, lib_land) and .device/peers_slim.tar.xz. The bench runs with --timer events
# under ncu (ncu serialises the kernels, so the queued timer's hold kernel would only time out), --repeats 3, --no-check
# (call 1 checked the same library). Launches are counted per kernel function (make sure by the durations beside the
# bench's own table, kept next to each CSV): with --repeats 3 a measurement is 6 calls; the staggered row is 6 calls of
# L = 16 steps; every step launches the non-flush kernel (blocks of flushing sequences return), so the non-flush kernel's
# launches run: staggered 0-95, non-flush step 96-101, flush step 102-107, FP16 read 108-113, FP8 114-119, NVFP4 120-125.
#  1. B = 32 and 256, Nemotron-3-Super: our staggered step's two kernels and vLLM 0.33.0's ReplaySSM kernel.
#  2. The LP reads that miss without a bound by bytes, B = 256: NVFP4 on Super (with per-instruction counts: the source
#     page as SASS, so the instructions can be split between the state loop, the record phase and the fold), FP8 on
#     Qwen3.5-4B, FP16 on Kimi Linear (kda_nonflush_kernel).
#  3. If time is left: compute-sanitizer memcheck on test_decode_cuda's staggered-window cases (the forced flush heads per block among them).
# -> $OUT/results.tar. Summaries: python3 experiments/bench/decode_2026-12-05/session18/ncu_targets.py --copy-gbps G r/ncu_*.csv.xz
# Run from the repository root: TOTAL=480 bash experiments/bench/decode_2026-12-06/session28/call2.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-480}
unpack_pack ${PACK:-.device/pack45.tar.xz} lib_land
LP=$A/lib_land$SYS
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
profile() {  # name shape batch kernel skip count [extra ncu options]
  local t0=$SECONDS name=$1 shape=$2 batch=$3 kernel=$4 skip=$5 count=$6; shift 6
  [ $((TOTAL - SECONDS)) -lt 50 ] && { echo "ncu $name skipped (time)"; return; }
  LD_LIBRARY_PATH=$LP timeout -s INT $((TOTAL - SECONDS - 20 < 90 ? TOTAL - SECONDS - 20 : 90)) ncu --clock-control none \
    --kernel-name-base function --print-kernel-base demangled -k "regex:^$kernel\$" --launch-skip $skip --launch-count $count \
    $SECTIONS --metrics $EXTRA "$@" $B/replayssm-bench bench --shapes $shape --batch $batch --window 16 --drafts 8 \
    --repeats 3 --no-check --timer events --arena-gib 8 > $R/ncu_$name.out 2> $R/ncu_$name.log
  echo "ncu $name ($shape B=$batch, $kernel, launches $skip+$count) rc=$? $((SECONDS-t0))s"
}
CSV="--csv --page raw --print-units base"
profile super32_nonflush nemotron-3-super 32 replay_nonflush_kernel 80 16 $CSV
profile super32_flush nemotron-3-super 32 replay_flush_kernel 80 16 $CSV
profile super256_nonflush nemotron-3-super 256 replay_nonflush_kernel 80 16 $CSV
profile super256_flush nemotron-3-super 256 replay_flush_kernel 80 16 $CSV
tar -C . -xJf .device/peers_slim.tar.xz
for batch in 32 256; do
  t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "ncu vllm B=$batch skipped (time)"; continue; }
  timeout $((TOTAL - SECONDS - 30 < 90 ? TOTAL - SECONDS - 30 : 90)) ncu --clock-control none -k "regex:_replayssm_output_only" \
    --launch-skip 4 --launch-count 6 $SECTIONS --metrics $EXTRA $CSV python3 scripts/bench_peers.py --peers vllm \
    --shapes nemotron-3-super --batch $batch --window 16 --timer events > $R/ncu_vllm$batch.out 2> $R/ncu_vllm$batch.log
  echo "ncu vllm B=$batch rc=$? $((SECONDS-t0))s"
done
# The NVFP4 read with per-instruction counts: a report, then its source page as SASS (one launch is enough for counts).
t0=$SECONDS
if [ $((TOTAL - SECONDS)) -gt 70 ]; then
  LD_LIBRARY_PATH=$LP timeout -s INT 80 ncu --clock-control none --kernel-name-base function -k "regex:^replay_nonflush_kernel\$" \
    --launch-skip 122 --launch-count 1 --section SourceCounters --section InstructionStats --metrics $EXTRA -o $R/nvfp4_super \
    $B/replayssm-bench bench --shapes nemotron-3-super --batch 256 --window 16 --drafts 8 --repeats 3 --no-check --timer events \
    --arena-gib 8 > $R/ncu_nvfp4_src_bench.txt 2> $R/ncu_nvfp4_src.log
  echo "ncu nvfp4 source counters rc=$? $((SECONDS-t0))s"
  ncu -i $R/nvfp4_super.ncu-rep --page source --print-source sass --csv > $R/nvfp4_super_sass.csv 2>> $R/ncu_nvfp4_src.log
  echo "source page rc=$? $(wc -l < $R/nvfp4_super_sass.csv) lines"
  ncu -i $R/nvfp4_super.ncu-rep --page details --section InstructionStats --section SourceCounters > $R/nvfp4_super_details.txt 2>&1
fi
profile super256_nvfp4 nemotron-3-super 256 replay_nonflush_kernel 120 6 $CSV
profile qwen4b_fp8 qwen3.5-4b 256 replay_nonflush_kernel 114 6 $CSV
profile kimi_fp16 kimi-linear-48b-a3b 256 kda_nonflush_kernel 108 6 $CSV
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
python3 experiments/bench/decode_2026-12-05/session18/ncu_targets.py --copy-gbps ${COPY_GBPS:-4250} $R/ncu_*.csv | tee $R/ncu_summary.txt | cut -c1-160
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 60 ] && { LD_LIBRARY_PATH=$LP timeout $((TOTAL - SECONDS - 15)) compute-sanitizer --tool memcheck \
  $B/test_decode_cuda -tc="*staggered windows*" > $R/memcheck_flush_heads.txt 2>&1
  echo "memcheck flush heads rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_flush_heads.txt)"; }
pack_results
