#!/usr/bin/env bash
# Session 21, second device call (about TOTAL = 480 s): pack .device/pack23.tar.xz (make_pack23.sh) and
# .device/peers_slim.tar.xz. Rules in README.md, written before the run.
# 1. lib_e2f: both decode suites whole; lib_e and lib_e2: the KDA suite (their change is KDA's conventional kernel).
# 2. Rounds (3 if time allows): lib_e2f and lib_land on every paper shape at B = 32 and 256 (L = 16, T = 8), lib_e2 and
#    lib_e on Kimi Linear, alternating; lib_e2f's rounds on main's kernels plus E2 and F are the run of record if
#    both land.
# 3. Nsight Compute on lib_e2f at B = 256: Kimi's and Nano's conventional kernels, Super's and Qwen3.5-4B's
#    verification with a flush (launch counting as session18/ncu_targets_call.sh).
# 4. vLLM's Mamba-2 kernels (run_peers) with what is left.
# -> $OUT/results.tar. Run from the repository root: TOTAL=480 bash experiments/bench/decode_2026-12-06/session21/call.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-480}
unpack_pack ${PACK:-.device/pack23.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_e2f) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 200 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
suite lib_e2f test_decode_cuda; suite lib_e2f test_decode_kda_cuda
suite lib_e2 test_decode_kda_cuda; suite lib_e test_decode_kda_cuda
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
bench() {  # library shapes name
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 150 $B/replayssm-bench bench --shapes $2 --batch 32 256 --window 16 --drafts 8 \
    --csv $R/$3.csv > $R/$3.txt 2>&1
  echo "$3 rc=$? $((SECONDS-t0))s"
}
for round in 1 2 3; do
  [ $round -gt 1 ] && [ $SECONDS -gt $((TOTAL * 45 / 100)) ] && { echo "round $round skipped (time)"; break; }
  bench lib_e2f "$ALL" record_lib_e2f_$round
  bench lib_e2 kimi-linear-48b-a3b kimi_lib_e2_$round
  bench lib_land "$ALL" record_lib_land_$round
  bench lib_e kimi-linear-48b-a3b kimi_lib_e_$round
done
grep -h "conventional fp32" $R/record_*_1.txt $R/kimi_*_1.txt | grep "|  256 |" | cut -c1-140
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum
LIMIT=$((TOTAL - 100))
profile() {  # name shape kernel skip count
  local t0=$SECONDS
  [ $((LIMIT - SECONDS)) -lt 45 ] && { echo "ncu $1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib lib_e2f) timeout -s INT $((LIMIT - SECONDS - 10)) ncu --clock-control none --kernel-name-base function \
    --print-kernel-base demangled -k "regex:^$3\$" --launch-skip $4 --launch-count $5 $SECTIONS --metrics $EXTRA --csv \
    --page raw --print-units base $B/replayssm-bench bench --shapes $2 --batch 256 --window 16 --drafts 8 --repeats 3 \
    --no-check --arena-gib 24 > $R/ncu_$1.out 2> $R/ncu_$1.log
  echo "ncu $1 ($2, $3, launches $4+$5) rc=$? $((SECONDS-t0))s"
}
profile kimi_conv kimi-linear-48b-a3b kda_conventional_kernel 0 6
profile nemotron_verify_flush nemotron-3-super verify_kernel 6 6
profile nano_conv nemotron-3-nano-4b conventional_kernel 0 6
profile qwen3_verify_flush qwen3.5-4b verify_kernel 6 6
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
run_peers $TOTAL
pack_results
