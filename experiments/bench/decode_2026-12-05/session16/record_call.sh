#!/usr/bin/env bash
# The landing checks and a run of record for one library. Default: pack16's lib_land (main's library; b6c66cc's
# build is SASS-identical to it, 308 of 308 functions). After a variant of flush_rows_call.sh lands, rebuild the
# pack with the landed library as lib_land and pass PACK=<it>.
#   PACK (default .device/pack16.tar.xz), LIB (default lib_land): the pack and the library folder in it.
# 1. Both decode suites whole (test_decode_cuda, test_decode_kda_cuda).
# 2. memcheck on the KDA replay and verification cases, and on test_decode_cuda's cases that main_call.sh ran it on.
# 3. Every paper shape at B = 32 and 256, L = 16, T = 8, 2 rounds (the second only if time is left), as
#    session 14's main_call.sh; summarise with ../../decode_2026-12-04/call5_flush_mma/call5_final/targets.py.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session16/record_call.sh
source "$(dirname "$0")/../device_common.sh"
PACK=${PACK:-.device/pack16.tar.xz}; LIB=${LIB:-lib_land}
unpack_pack "$PACK" "$LIB"
LP=$A/$LIB$SYS
LD_LIBRARY_PATH=$LP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
ok=1
for t in test_decode_kda_cuda test_decode_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$LP timeout 200 $B/$t > $R/$t.txt 2>&1
  rc=$?; echo "$t rc=$rc $((SECONDS-t0))s $(tail -n 3 $R/$t.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/$t.txt || ok=0
done
t0=$SECONDS; LD_LIBRARY_PATH=$LP timeout 120 compute-sanitizer --tool memcheck $B/test_decode_kda_cuda \
  -tc="*ReplaySSM decode kernels equal*,*after verification*,*verification kernels*" > $R/memcheck_kda.txt 2>&1
rc=$?; echo "memcheck kda rc=$rc $((SECONDS-t0))s $(tail -n 1 $R/memcheck_kda.txt)"
t0=$SECONDS; LD_LIBRARY_PATH=$LP timeout 200 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*conventional*,*staggered windows*,*appendix F skipping*,*after verification commits*" > $R/memcheck_decode.txt 2>&1
rc=$?; echo "memcheck decode rc=$rc $((SECONDS-t0))s $(tail -n 1 $R/memcheck_decode.txt)"
if [ $ok = 1 ]; then
  for round in 1 2; do
    [ $round = 2 ] && [ $SECONDS -gt 420 ] && { echo "record round 2 skipped (time)"; break; }
    t0=$SECONDS
    LD_LIBRARY_PATH=$LP timeout 170 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b \
      qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 --window 16 --drafts 8 --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
    echo "record $round rc=$? $((SECONDS-t0))s"
  done
fi
pack_results
