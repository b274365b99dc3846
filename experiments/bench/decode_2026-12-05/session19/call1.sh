#!/usr/bin/env bash
# Session 19, call 1 (pack .device/pack19.tar.xz: main's library, bench and GPU suites built at the commit in
# bin/COMMIT; .device/peers.tar.xz: vLLM 0.33.0's Mamba-2 ops and FlashInfer 0.7.2's Python files with
# checkpointing_ssu prebuilt for sm_90a, as scripts/fetch_peers.sh extracts them, and apache-tvm-ffi for the
# image's CPython 3.12):
# 1. ../session16/record_call.sh: both decode suites whole, memcheck, every paper shape at B = 32 and 256, 2 rounds
#    -> $OUT/record.tar;
# 2. ours on the Mamba-2 shapes at B = 64 and 128 (the record has 32 and 256); vLLM 0.33.0's ReplaySSM kernel and
#    tuned selective_state_update at B = 32, 64, 128, 256; FlashInfer's checkpointing_ssu (monolith and two-kernel)
#    at the same B, in the time left of TOTAL seconds (default 580) -> $OUT/peers.tar.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session19/call1.sh
here=experiments/bench/decode_2026-12-05
export PACK=.device/pack19.tar.xz
bash $here/session16/record_call.sh && mv "$OUT/results.tar" "$OUT/record.tar"
source $here/device_common.sh
unpack_pack $PACK lib_land
cat $A/bin/COMMIT > $R/pack_commit.txt
t0=$SECONDS; LD_LIBRARY_PATH=$A/lib_land$SYS timeout 100 $B/replayssm-bench bench --shapes nemotron-3-super \
  nemotron-3-nano-4b --batch 64 128 --window 16 --drafts 8 --csv $R/ours_b64_128.csv > $R/ours_b64_128.txt 2>&1
echo "ours B=64,128 rc=$? $((SECONDS-t0))s"
tar -C . -xJf .device/peers.tar.xz
left=$((${TOTAL:-580} - SECONDS - 10))
t0=$SECONDS; timeout $((left < 150 ? left : 150)) python3 scripts/bench_peers.py --peers vllm --batch 32 64 128 256 \
  --window 16 --csv $R/peers_vllm.csv > $R/peers_vllm.log 2>&1
echo "vllm rc=$? $((SECONDS-t0))s"; tail -n 20 $R/peers_vllm.log
python3 -m pip install --no-deps --no-index .peers/wheels/apache_tvm_ffi-*cp312*.whl > $R/fi_setup.txt 2>&1; echo "tvm_ffi rc=$?"
left=$((${TOTAL:-580} - SECONDS - 10))
[ $left -gt 30 ] && { t0=$SECONDS; timeout $left python3 scripts/bench_peers.py --peers flashinfer --batch 32 64 128 256 \
  --window 16 --csv $R/peers_flashinfer.csv > $R/peers_flashinfer.log 2>&1
  echo "flashinfer rc=$? $((SECONDS-t0))s"; tail -n 12 $R/peers_flashinfer.log; }
pack_results && mv "$OUT/results.tar" "$OUT/peers.tar"
ls -la "$OUT"
