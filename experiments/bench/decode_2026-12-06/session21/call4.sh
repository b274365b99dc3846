#!/usr/bin/env bash
# Session 21, fourth device call (about TOTAL = 420 s), main's library as it stands after the session's landings:
# pack .device/pack24.tar.xz's lib_e3 (= c0706f0's library; the pack's binaries are at 75f4e73, no test or bench
# change since) and .device/peers_slim.tar.xz. On whichever card comes (an H200 makes it the run of record):
# 1. both decode suites whole;
# 2. every paper shape at B = 32 and 256 (L = 16, T = 8), 3 rounds; Mamba-2 shapes at B = 64, 128; the peers;
# 3. a probe of the GDN flush with one value head per block (--heads-per-block 1, which also sets the non-flush
#    kernel's) against the launcher's choice (0), Qwen3.5-4B and -122B, 2 alternating rounds (session18/hpb_probe.sh's
#    question: the flush grid is 10.3 waves of 3 blocks per SM on Qwen3.5-4B at B = 256);
# 4. Nsight Compute at B = 256 with what is left: GDN's flush (Qwen3.5-4B), Kimi's and Nano's conventional kernels,
#    Super's NVFP4 read and verification with a flush, Qwen3.5-4B's verification with a flush.
# -> $OUT/results.tar. Run from the repository root: TOTAL=420 bash experiments/bench/decode_2026-12-06/session21/call4.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-420}; LIB=${LIB:-lib_e3}
unpack_pack ${PACK:-.device/pack24.tar.xz} $LIB
LP=$A/$LIB$SYS
cat $A/bin/COMMIT > $R/pack_commit.txt
LD_LIBRARY_PATH=$LP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt; cat $R/gpu.txt
for t in test_decode_cuda test_decode_kda_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$LP timeout 200 $B/$t > $R/$t.txt 2>&1
  echo "$t rc=$? $((SECONDS-t0))s $(tail -n 3 $R/$t.txt | head -n 2 | tr '\n' ' ')"
done
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
for round in 1 2 3; do t0=$SECONDS
  LD_LIBRARY_PATH=$LP timeout 150 $B/replayssm-bench bench --shapes $ALL --batch 32 256 --window 16 --drafts 8 \
    --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
  echo "record $round rc=$? $((SECONDS-t0))s"
done
t0=$SECONDS; LD_LIBRARY_PATH=$LP timeout 60 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b \
  --batch 64 128 --window 16 --drafts 8 --csv $R/ours_b64_128.csv > $R/ours_b64_128.txt 2>&1
echo "ours B=64,128 rc=$? $((SECONDS-t0))s"
for round in 1 2; do
  for hpb in 1 0; do t0=$SECONDS
    LD_LIBRARY_PATH=$LP timeout 100 $B/replayssm-bench bench --shapes qwen3.5-4b qwen3.5-122b-a10b --batch 32 256 \
      --window 16 --drafts 8 --heads-per-block $hpb --csv $R/gdn_hpb${hpb}_$round.csv > $R/gdn_hpb${hpb}_$round.txt 2>&1
    echo "hpb $hpb round $round rc=$? $((SECONDS-t0))s"
  done
done
grep -H "flush step\|staggered\|non-flush step" $R/gdn_hpb*_1.txt | grep "|  256 |" | cut -c1-140
run_peers $((TOTAL - 120))
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum
profile() {  # name shape kernel skip count
  local t0=$SECONDS
  [ $((TOTAL - SECONDS)) -lt 30 ] && { echo "ncu $1 skipped (time)"; return; }
  LD_LIBRARY_PATH=$LP timeout -s INT $((TOTAL - SECONDS - 10)) ncu --clock-control none --kernel-name-base function \
    --print-kernel-base demangled -k "regex:^$3\$" --launch-skip $4 --launch-count $5 $SECTIONS --metrics $EXTRA --csv \
    --page raw --print-units base $B/replayssm-bench bench --shapes $2 --batch 256 --window 16 --drafts 8 --repeats 3 \
    --no-check --arena-gib 24 > $R/ncu_$1.out 2> $R/ncu_$1.log
  echo "ncu $1 ($2, $3, launches $4+$5) rc=$? $((SECONDS-t0))s"
}
profile qwen3_flush qwen3.5-4b replay_flush_kernel 96 12
profile kimi_conv kimi-linear-48b-a3b kda_conventional_kernel 0 6
profile nano_conv nemotron-3-nano-4b conventional_kernel 0 6
profile nemotron_nvfp4 nemotron-3-super replay_nonflush_kernel 120 6
profile nemotron_verify_flush nemotron-3-super verify_kernel 6 6
profile qwen3_verify_flush qwen3.5-4b verify_kernel 6 6
for f in $R/ncu_*.out; do [ -f "$f" ] || continue; grep '^"' $f > ${f%.out}.csv; grep '^|\|^#' $f > ${f%.out}_bench.txt; rm $f; done
pack_results
