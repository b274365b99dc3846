#!/usr/bin/env bash
# Issue 13, session 11, call 2: the LP reads on the tensor cores (lib) against 75f8378 (lib_base):
# GPU tests, then the A/B bench (B = 32, 256; 2 rounds alternating).
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack6.tar.xz
A=$PWD/.device/a; B=$A/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
NEW=$A/lib$SYS; OLD=$A/lib_base$SYS
LD_LIBRARY_PATH=$NEW $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 240 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
if ! grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then grep -B5 -A25 "ERROR" $R/test_decode_cuda.txt | head -80; fi
grep "SR bit-exact" $R/test_decode_cuda.txt | grep -E "nvfp4|fp8b128/fp32" | head -12
for round in 1 2; do
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/main_new_$round.csv > $R/main_new_$round.txt 2>&1; echo "main new $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 150 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/main_old_$round.csv > $R/main_old_$round.txt 2>&1; echo "main old $round rc=$? $((SECONDS-t1))s"
done
grep -E "non-flush read|fp32 non-flush" $R/main_new_1.txt | grep "| *256 |" | head -20
sed -i "s#$PWD#<repository>#g" $R/*.txt 2>/dev/null
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
