#!/usr/bin/env bash
# Session 35: H9's A/B in what device time was left (280 s after ten attempts without a machine): session 29's
# call1.sh without the record, every step stopped by one deadline (device_common.sh's ab_rounds with AB_END) and its
# results snapshotted as it ends, so that a call stopped at its limit still returns the rounds that ran. test_decode_cuda on ARM, then alternating rounds
# (ARM first in odd rounds) of the five paper shapes at B = 128 and 256, each configuration checked against the CPU
# decoders before timing, then judge_h.py on the rounds that completed.
# Run from the repository root on the device, carrying PACK (make_pack_arm.sh) and .device/formats_v1.json.xz:
#   ARM=lib_h9 PACK=.device/pack56.tar.xz A_MODEL=qwen3.5-4b TOTAL=210 bash experiments/bench/decode_2026-12-07/session35/ab_lean.sh
# -> $OUT/results.tar: r/test_decode_cuda_<arm>.txt, r/ab_{ARM,lib_land}_{1,2,3}.{csv,txt}, r/judge_device.txt.
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-210}; ARM=${ARM:?ARM names the arm library}
unpack_pack ${PACK:?PACK names the pack} lib_land
for l in lib_land $ARM; do [ -d "$A/$l" ] || { echo "ab_lean.sh: the pack has no $l" >&2; exit 2; }; done
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$A/$ARM$SYS timeout 60 $B/test_decode_cuda > $R/test_decode_cuda_${ARM#lib_}.txt 2>&1
echo "test_decode_cuda ($ARM) rc=$? $((SECONDS-t0))s"; tail -n 2 $R/test_decode_cuda_${ARM#lib_}.txt
snapshot_results
AB_SHAPES="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b" AB_BATCH="128 256" \
  AB_TIMEOUT=120 AB_END=$((TOTAL - 10)) ab_rounds $ARM
J=$(mktemp -d); for f in $R/ab_*.csv; do [ -s $f ] && xz -c $f > $J/$(basename $f).xz; done
python3 experiments/bench/decode_2026-12-06/session28/judge_h.py --arm $ARM ${A_MODEL:+--a-model $A_MODEL} $J > $R/judge_device.txt 2>&1
cat $R/judge_device.txt
pack_results
