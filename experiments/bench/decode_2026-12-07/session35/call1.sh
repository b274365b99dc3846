#!/usr/bin/env bash
# Session 35, call 1 (pack52 built at HEAD by session32/make_pack.sh; carry .device/pack52.tar.xz,
# .device/peers_slim.tar.xz, .device/formats_v1.json.xz). What runs depends on the card that comes:
# - an H200: session 33's h200_call.sh, the run of record the issue's done-when needs, with Nsight Compute;
# - otherwise (every call since session 21 got an H100): what main's library has not yet had on a GPU: the three CUDA
#   suites whole (test_decode_cuda's last case, a NaN NVFP4 block-scale code, has never run) and racecheck of
#   test_decode_cuda's cases 02 and 03 (the tensor-core reads H8b changed) in 4 shards each.
# Run from the repository root on the device: bash experiments/bench/decode_2026-12-07/session35/call1.sh
# -> H200: $OUT/record.tar, ncu_nvfp4.tar, ncu_kimi_fp16.tar; else $OUT/suites/*.txt and $OUT/results.tar (racecheck).
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "card: $gpu"
if [[ $gpu == *H200* ]]; then
  TOTAL=560 bash experiments/bench/decode_2026-12-07/session33/h200_call.sh
  exit
fi
PACK=.device/pack52.tar.xz
mkdir -p .device/a "$OUT/suites" && tar -C .device/a -xJf $PACK
[ -f data/goldens/formats_v1.json ] || { mkdir -p data/goldens && xz -dc .device/formats_v1.json.xz > data/goldens/formats_v1.json; }
A=$PWD/.device/a; SYS=""; LD_LIBRARY_PATH=$A/lib_land ldd $A/bin/replayssm-bench | grep -q "not found" && SYS=":$A/sys"
for suite in test_decode_cuda test_decode_kda_cuda test_formats_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$A/lib_land$SYS timeout 150 $A/bin/$suite > "$OUT/suites/$suite.txt" 2>&1
  echo "$suite rc=$? $((SECONDS-t0))s $(grep 'test cases:' "$OUT/suites/$suite.txt" | tr -s ' ')" | tee -a "$OUT/suites/summary.txt"
done
sed -i "s#$PWD#<repository>#g" "$OUT"/suites/*.txt
CASES="test_decode_cuda|02 test_decode_cuda|03" SHARDS=4 TOOL=racecheck LIB=lib_land PACK=$PACK PAR=8 \
  TOTAL=$((575 - SECONDS)) bash experiments/bench/decode_2026-12-07/session31/sanitize_cases.sh
