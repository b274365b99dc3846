#!/usr/bin/env bash
# Session 14: main as committed (the build of 40ce3fc, kernels of 9adba03) on the H200: both suites whole,
# memcheck, and the bench on every paper shape at B = 32 and 256, two rounds.
# Pack .device/pack14h.tar.xz: bin/ (main's bench and test binaries), lib_main/, sys/.
source "$(dirname "$0")/device_common.sh"
unpack_pack .device/pack14h.tar.xz lib_main
L=$A/lib_main$SYS
LD_LIBRARY_PATH=$L $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
ok=1
for t in test_decode_cuda test_decode_kda_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$L timeout 200 $B/$t > $R/$t.txt 2>&1
  echo "$t rc=$? $((SECONDS-t0))s $(tail -n 3 $R/$t.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/$t.txt || ok=0
done
t0=$SECONDS; LD_LIBRARY_PATH=$L timeout 200 compute-sanitizer --tool memcheck $B/test_decode_cuda \
  -tc="*conventional*,*staggered windows*,*appendix F skipping*,*after verification commits*" > $R/memcheck.txt 2>&1
echo "memcheck rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck.txt)"
if [ $ok = 1 ]; then
  for round in 1 2; do t0=$SECONDS
    LD_LIBRARY_PATH=$L timeout 150 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b \
      qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 --window 16 --drafts 8 --csv $R/main_new_$round.csv > $R/main_new_$round.txt 2>&1
    echo "bench $round rc=$? $((SECONDS-t0))s"
  done
fi
pack_results
