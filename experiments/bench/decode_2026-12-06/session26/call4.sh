#!/usr/bin/env bash
# Session 26, call 4 (about TOTAL = 150 s): the peers under both timers (replayssm_py/peer_timing.py) beside ours, on
# the Mamba-2 shapes at B = 32-256: is vLLM's small-B time its kernel's or its host's? Pack .device/pack41.tar.xz and
# .device/peers_slim.tar.xz. -> $OUT/results.tar.
# Run from the repository root: TOTAL=150 bash experiments/bench/decode_2026-12-06/session26/call4.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-150}
unpack_pack ${PACK:-.device/pack41.tar.xz} lib_land
lib() { echo "$A/$1$SYS"; }
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
t0=$SECONDS
LD_LIBRARY_PATH=$(lib lib_land) timeout 60 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b \
  --batch 32 64 128 256 --window 16 --drafts 8 --csv $R/ours.csv > $R/ours.txt 2>&1
echo "ours rc=$? $((SECONDS-t0))s"
tar -C . -xJf .device/peers_slim.tar.xz
python3 -m pip install --no-deps --no-index .peers/wheels/apache_tvm_ffi-*cp312*.whl > $R/fi_setup.txt 2>&1
for timer in graph events; do
  for peer in vllm flashinfer; do
    left=$((TOTAL - SECONDS - 10)); [ $left -lt 15 ] && { echo "$peer $timer skipped (time)"; continue; }
    t0=$SECONDS
    timeout $left python3 scripts/bench_peers.py --peers $peer --timer $timer --batch 32 64 128 256 --window 16 \
      --csv $R/peers_${peer}_$timer.csv > $R/peers_${peer}_$timer.log 2>&1
    echo "$peer $timer rc=$? $((SECONDS-t0))s"; grep "^| nemotron" $R/peers_${peer}_$timer.log | cut -c1-110
  done
done
pack_results
