#!/usr/bin/env bash
# Session 18, a probe of the GDN flush step (88.6-90.7% of copy where Mamba-2's is at 95-96%; call5_ncu): one value
# head per block (--heads-per-block 1, which also sets the non-flush kernel's) against the launcher's choice
# (2 heads per flush block on both Qwen shapes; the flush grid is then 16 x 256 blocks on Qwen3.5-4B, 10.3 waves of
# 3 blocks per SM on 132 SMs), Qwen3.5-4B and -122B at B = 32 and 256, 2 interleaved rounds. Pack $PACK
# (default .device/pack18.tar.xz).
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session18/hpb_probe.sh
source "$(dirname "$0")/../device_common.sh"
unpack_pack ${PACK:-.device/pack18.tar.xz} lib_land
LP=$A/lib_land$SYS
for round in 1 2; do
  for hpb in 0 1; do t0=$SECONDS
    LD_LIBRARY_PATH=$LP timeout 100 $B/replayssm-bench bench --shapes qwen3.5-4b qwen3.5-122b-a10b --batch 32 256 \
      --window 16 --drafts 8 --heads-per-block $hpb --csv $R/gdn_hpb${hpb}_$round.csv > $R/gdn_hpb${hpb}_$round.txt 2>&1
    echo "hpb $hpb round $round rc=$? $((SECONDS-t0))s"
    [ $SECONDS -gt ${TOTAL:-200} ] && break 2
  done
done
grep -H "flush step\|staggered\|non-flush step" $R/gdn_hpb*_1.txt | grep "|  256 |" | cut -c1-140
pack_results
