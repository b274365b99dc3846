#!/usr/bin/env bash
# Session 15, call 2. Pack .device/pack15b.tar.xz: bin/ (main's bench and test binaries, as in pack14h), sys/,
#   lib_land/: main + the KDA non-flush records by cp.async (call 1's "records" variant: its 14 non-flush
#              instances are SASS-identical to the ones measured there; every other function to main's);
#   lib_flush/: lib_land + the KDA flush's records by cp.async, its first two rows issued before them, and
#              64 registers at dk = 128 (4 blocks per SM).
# 1. lib_land: both suites whole, memcheck on the KDA replay/verification cases (the landing checks).
# 2. lib_flush: test_decode_kda_cuda whole, and Kimi at B = 32, 256 against lib_land, 2 rounds.
# 3. lib_land: the run of record, every paper shape at B = 32 and 256, 2 rounds (as session 14's main_call.sh).
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session15/call2.sh
source "$(dirname "$0")/../device_common.sh"
unpack_pack .device/pack15b.tar.xz lib_land
LAND=$A/lib_land$SYS; FLUSH=$A/lib_flush$SYS
LD_LIBRARY_PATH=$LAND $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
ok=1
for t in test_decode_kda_cuda test_decode_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$LAND timeout 200 $B/$t > $R/land_$t.txt 2>&1
  echo "land $t rc=$? $((SECONDS-t0))s $(tail -n 3 $R/land_$t.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/land_$t.txt || ok=0
done
t0=$SECONDS; LD_LIBRARY_PATH=$LAND timeout 150 compute-sanitizer --tool memcheck $B/test_decode_kda_cuda \
  -tc="*ReplaySSM*,*after verification*,*verification kernels*" > $R/land_memcheck.txt 2>&1
echo "land memcheck rc=$? $((SECONDS-t0))s $(tail -n 1 $R/land_memcheck.txt)"
t0=$SECONDS; LD_LIBRARY_PATH=$FLUSH timeout 150 $B/test_decode_kda_cuda > $R/flush_test.txt 2>&1
echo "flush test rc=$? $((SECONDS-t0))s $(tail -n 3 $R/flush_test.txt | head -n 2 | tr '\n' ' ')"
fok=1; grep -q "Status: SUCCESS" $R/flush_test.txt || fok=0
if [ $fok = 1 ]; then
  for round in 1 2; do for v in flush land; do L=$LAND; [ $v = flush ] && L=$FLUSH; t0=$SECONDS
    LD_LIBRARY_PATH=$L timeout 100 $B/replayssm-bench bench --shapes kimi-linear-48b-a3b --batch 32 256 --window 16 --drafts 8 \
      --csv $R/kimi_${v}_$round.csv > $R/kimi_${v}_$round.txt 2>&1
    echo "bench $v $round rc=$? $((SECONDS-t0))s"
  done; done
  grep -h "replay fp32 (stag\|flush step\|split nvfp4/fp32 (x" $R/kimi_*_1.txt | grep "|  256 |" | cut -c1-130
  t0=$SECONDS; LD_LIBRARY_PATH=$FLUSH timeout 100 compute-sanitizer --tool memcheck $B/test_decode_kda_cuda \
    -tc="*ReplaySSM decode kernels equal*,*after verification*" > $R/flush_memcheck.txt 2>&1
  echo "flush memcheck rc=$? $((SECONDS-t0))s $(tail -n 1 $R/flush_memcheck.txt)"
fi
if [ $ok = 1 ]; then
  for round in 1 2; do t0=$SECONDS
    [ $SECONDS -gt 330 ] && { echo "record round $round skipped (time)"; continue; }
    LD_LIBRARY_PATH=$LAND timeout 150 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b \
      qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 --window 16 --drafts 8 --csv $R/record_$round.csv > $R/record_$round.txt 2>&1
    echo "record $round rc=$? $((SECONDS-t0))s"
  done
fi
pack_results
