#!/usr/bin/env bash
# Issue 13, session 9, call 3: the committed library (replayssm-bench --version) against the session's
# starting library (12fda7f, lib_base): GPU tests, memcheck, the bench table (B = 32, 256, T = 8; 2 rounds,
# alternating) and a small-batch sweep (B = 8 ... 128).
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack3.tar.xz
A=$PWD/.device/a; B=$A/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
SYS=""
if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
NEW=$A/lib$SYS; OLD=$A/lib_base$SYS
LD_LIBRARY_PATH=$NEW $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 240 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
if ! grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then grep -B5 -A20 "ERROR" $R/test_decode_cuda.txt | head -60; fi
for round in 1 2; do
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/main_new_$round.csv > $R/main_new_$round.txt 2>&1; echo "main new $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 150 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/main_old_$round.csv > $R/main_old_$round.txt 2>&1; echo "main old $round rc=$? $((SECONDS-t1))s"
done
t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 $B/replayssm-bench bench --batch 8 16 64 128 --window 16 --drafts 8 --csv $R/small_new.csv > $R/small_new.txt 2>&1; echo "small new rc=$? $((SECONDS-t1))s"
t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 150 $B/replayssm-bench bench --batch 8 16 64 128 --window 16 --drafts 8 --csv $R/small_old.csv > $R/small_old.txt 2>&1; echo "small old rc=$? $((SECONDS-t1))s"
if grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*staggered windows*,*appendix F skipping*,*after verification commits*,*verification kernels*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
fi
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
