#!/usr/bin/env bash
# Session 18, call 5 (pack .device/pack18.tar.xz, main's library with both of session 18's landings):
# 1. ../session16/record_call.sh on it: both decode suites whole, memcheck, every paper shape at B = 32 and 256
#    (the run of record of the landed library) -> $OUT/record.tar;
# 2. ncu_targets_call.sh in the time left of TOTAL seconds (default 570; pass less when the call's limit is lower)
#    -> $OUT/ncu.tar.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session18/call5.sh
here=experiments/bench/decode_2026-12-05
PACK=.device/pack18.tar.xz bash $here/session16/record_call.sh && mv "$OUT/results.tar" "$OUT/record.tar"
LIMIT=$((${TOTAL:-570} - SECONDS)) bash $here/session18/ncu_targets_call.sh && mv "$OUT/results.tar" "$OUT/ncu.tar"
ls -la "$OUT"
