#!/usr/bin/env bash
# Session 27, call 2 (about TOTAL = 590 s; device starts were failing, so one call does both jobs). Pack
# .device/pack43.tar.xz and .device/peers_slim.tar.xz. -> $OUT/results.tar.
#  1. test_decode_cuda (flush_heads_per_block cases included) against the CPU decoders, on lib_land and on lib_pf with
#     a 64 KiB prefetch (l2_prefetch.patch: not landed; REPLAYSSM_L2_PREFETCH_KIB).
#  2. The bench's two timers, Mamba-2 shapes at B = 32 and 256: queued (default) against events.
#  3. Small-B sweep of the staggered step (queued, --no-check, B = 32-256), Super and Nano: the launcher's choice;
#     heads per block 2 in both kernels; 1 and 2 in the flush kernel alone; lib_pf with no prefetch (the patch's
#     cost) and with 32 and 64 KiB.
#  4. One record round (every paper shape, B = 32 and 256, checked), B = 8-128 (one round), and the peers
#     graph-timed (record.sh's run_peers), with the defaults of pack43 (no prefetch, the launcher's heads).
# RECORD=0: steps 1-3 only.
# Run from the repository root: TOTAL=590 bash experiments/bench/decode_2026-12-06/session27/call2.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-590}
unpack_pack ${PACK:-.device/pack43.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 100 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1
echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -n 3 $R/test_decode_cuda.txt
t0=$SECONDS
REPLAYSSM_L2_PREFETCH_KIB=64 LD_LIBRARY_PATH=$(lib lib_pf) timeout 100 $B/test_decode_cuda -tc="*ReplaySSM decode kernels*" \
  > $R/test_decode_cuda_pf64.txt 2>&1
echo "test_decode_cuda lib_pf 64 KiB rc=$? $((SECONDS-t0))s"; tail -n 3 $R/test_decode_cuda_pf64.txt
bench() {  # name limit [options]; $LIB (default lib_land), $PF (KiB, lib_pf's REPLAYSSM_L2_PREFETCH_KIB)
  local name=$1 limit=$2 t0=$SECONDS; shift 2
  REPLAYSSM_L2_PREFETCH_KIB=${PF:-0} LD_LIBRARY_PATH=$(lib ${LIB:-lib_land}) timeout $limit $B/replayssm-bench bench --window 16 --drafts 8 --csv $R/$name.csv "$@" \
    > $R/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS-t0))s"; grep "staggered" $R/$name.txt | cut -c1-112
}
bench timer_queued 60 --shapes nemotron-3-super nemotron-3-nano-4b --batch 32 256 --no-check
bench timer_events 60 --shapes nemotron-3-super nemotron-3-nano-4b --batch 32 256 --timer events --no-check
SWEEP_END=$((SECONDS + ${SWEEP:-170}))
for shape in nemotron-3-super nemotron-3-nano-4b; do
  for v in "auto lib_land 0" "hpb2 lib_land 0 --heads-per-block 2" "fhpb1 lib_land 0 --flush-heads-per-block 1" \
           "fhpb2 lib_land 0 --flush-heads-per-block 2" "pf0 lib_pf 0" "pf32 lib_pf 32" "pf64 lib_pf 64"; do
    set -- $v; name=$1; lib_name=$2; kib=$3; shift 3
    [ $SECONDS -gt $SWEEP_END ] && { echo "${shape}_$name skipped (time)"; continue; }
    LIB=$lib_name PF=$kib bench ${shape}_$name 30 --shapes $shape --batch 32 64 128 256 --no-check "$@"
  done
done
if [ "${RECORD:-1}" = 1 ]; then
ALL="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b"
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 170 ] && { LD_LIBRARY_PATH=$(lib lib_land) timeout 150 $B/replayssm-bench bench --shapes $ALL \
  --batch 32 256 --window 16 --drafts 8 --csv $R/record_1.csv > $R/record_1.txt 2>&1; echo "record round 1 rc=$? $((SECONDS-t0))s"; }
t0=$SECONDS
[ $((TOTAL - SECONDS)) -gt 130 ] && { LD_LIBRARY_PATH=$(lib lib_land) timeout 100 $B/replayssm-bench bench --shapes $ALL \
  --batch 8 16 64 128 --window 16 --drafts 8 --csv $R/other_batches.csv > $R/other_batches.txt 2>&1
  echo "other batches rc=$? $((SECONDS-t0))s"; }
run_peers $((TOTAL - 10))
fi
pack_results
