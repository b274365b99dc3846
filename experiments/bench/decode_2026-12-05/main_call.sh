#!/usr/bin/env bash
# Session 14: main as committed (the build of 40ce3fc, kernels of 9adba03) on the H200: both suites whole,
# memcheck, and the bench on every paper shape at B = 32 and 256, two rounds.
# Pack .device/pack14h.tar.xz: bin/ (main's bench and test binaries), lib_main/, sys/.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack14h.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; LD_LIBRARY_PATH=$A/lib_main ldd $B/replayssm-bench | grep -q "not found" && SYS=":$A/sys"
L=$A/lib_main$SYS
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
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
sed -i "s#$PWD#<repository>#g" $R/*.txt $R/*.csv 2>/dev/null
xz -9 -T8 $R/*.txt $R/*.csv 2>/dev/null; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
