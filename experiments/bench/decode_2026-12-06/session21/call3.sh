#!/usr/bin/env bash
# Session 21, third device call (about TOTAL = 450 s): pack .device/pack24.tar.xz (make_pack24.sh) and
# .device/peers_slim.tar.xz. Rules in README.md ("Call 3"), written before the run.
# 1. lib_land (main: C, D, F landed): both decode suites whole; lib_e3 and lib_e: the KDA suite.
# 2. Rounds (3 if time allows): lib_e3 and lib_land on every paper shape at B = 32 and 256 (L = 16, T = 8), lib_e on
#    Kimi Linear, alternating: the landing comparison, and lib_land's rounds (or lib_e3's, if E3 lands) the run of record.
# 3. Peers in the same call (vLLM's Mamba-2 kernels, FlashInfer's checkpointing_ssu) at B = 32-256.
# 4. Nsight Compute on lib_land at B = 256 with what is left: Super's NVFP4 read and its verification with a flush.
# -> $OUT/results.tar. Run from the repository root: TOTAL=450 bash experiments/bench/decode_2026-12-06/session21/call3.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-450}
unpack_pack ${PACK:-.device/pack24.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$(lib lib_land) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
suite() {  # library test
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 200 $B/$2 > $R/${1}_$2.txt 2>&1
  echo "$1 $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/${1}_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/${1}_$2.txt || grep -B5 -A25 "ERROR" $R/${1}_$2.txt | head -40
}
suite lib_land test_decode_cuda; suite lib_land test_decode_kda_cuda
suite lib_e3 test_decode_kda_cuda; suite lib_e test_decode_kda_cuda
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
bench() {  # library shapes name
  local t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $1) timeout 150 $B/replayssm-bench bench --shapes $2 --batch 32 256 --window 16 --drafts 8 \
    --csv $R/$3.csv > $R/$3.txt 2>&1
  echo "$3 rc=$? $((SECONDS-t0))s"
}
for round in 1 2 3; do
  [ $round -gt 1 ] && [ $SECONDS -gt $((TOTAL * 40 / 100)) ] && { echo "round $round skipped (time)"; break; }
  bench lib_e3 "$ALL" record_lib_e3_$round
  bench lib_land "$ALL" record_lib_land_$round
  bench lib_e kimi-linear-48b-a3b kimi_lib_e_$round
done
grep -h "conventional fp32" $R/record_*_1.txt $R/kimi_*_1.txt | grep "|  256 |" | cut -c1-140
for l in lib_land; do t0=$SECONDS
  LD_LIBRARY_PATH=$(lib $l) timeout 60 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b --batch 64 128 \
    --window 16 --drafts 8 --csv $R/ours_${l}_b64_128.csv > $R/ours_${l}_b64_128.txt 2>&1
  echo "ours $l B=64,128 rc=$? $((SECONDS-t0))s"
done
run_peers $((TOTAL - 70))
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum
profile() {  # name shape kernel skip count
  local t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 40 ] && { echo "ncu $1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$(lib lib_land) timeout -s INT $((TOTAL - SECONDS - 15)) ncu --clock-control none --kernel-name-base function \
    --print-kernel-base demangled -k "regex:^$3\$" --launch-skip $4 --launch-count $5 $SECTIONS --metrics $EXTRA --csv \
    --page raw --print-units base $B/replayssm-bench bench --shapes $2 --batch 256 --window 16 --drafts 8 --repeats 3 \
    --no-check --arena-gib 24 > $R/ncu_$1.out 2> $R/ncu_$1.log
  echo "ncu $1 ($2, $3, launches $4+$5) rc=$? $((SECONDS-t0))s"
}
profile nemotron_verify_flush nemotron-3-super verify_kernel 6 6
profile nemotron_nvfp4 nemotron-3-super replay_nonflush_kernel 120 6
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
pack_results
