#!/usr/bin/env bash
# Issue 13, session 9, call 7: replay kernels whose returning blocks skip the block geometry (lib_lazy)
# against 5aee9d7 (lib): GPU tests, memcheck, bench A/B 2 rounds.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack4.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
NEW=$A/lib_lazy$SYS; OLD=$A/lib$SYS
t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 240 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
if ! grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then grep -B5 -A20 "ERROR" $R/test_decode_cuda.txt | head -60; fi
S="--shapes nemotron-3-nano-4b nemotron-3-super qwen3.5-4b qwen3.5-122b-a10b --batch 16 32 64 256 --window 16 --drafts 8"
for round in 1 2; do
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 $B/replayssm-bench bench $S --csv $R/ab_lazy_$round.csv > $R/ab_lazy_$round.txt 2>&1; echo "lazy $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 150 $B/replayssm-bench bench $S --csv $R/ab_main_$round.csv > $R/ab_main_$round.txt 2>&1; echo "main $round rc=$? $((SECONDS-t1))s"
done
if grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*staggered windows*,*appendix F skipping*,*after verification commits*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
fi
sed -i "s|$PWD|<repository>|g" $R/*.txt
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
