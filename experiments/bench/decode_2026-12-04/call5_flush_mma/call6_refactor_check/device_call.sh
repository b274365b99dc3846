#!/usr/bin/env bash
# Issue 13, session 10, call 6: the flush kernel after the row-dot helper refactor (lib) against
# 3370f92's library (lib_base): test_decode_cuda, then the bench once each on the four
# Mamba-2/GDN shapes at B = 256 (is the refactor free?).
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
NEW=$A/lib$SYS; OLD=$A/lib_base$SYS
t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 240 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
S="--shapes nemotron-3-nano-4b nemotron-3-super qwen3.5-4b qwen3.5-122b-a10b --batch 256 --window 16 --drafts 8"
t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 100 $B/replayssm-bench bench $S --csv $R/main_new_1.csv > $R/main_new_1.txt 2>&1; echo "new rc=$? $((SECONDS-t1))s"
t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 100 $B/replayssm-bench bench $S --csv $R/main_old_1.csv > $R/main_old_1.txt 2>&1; echo "old rc=$? $((SECONDS-t1))s"
sed -i "s#$PWD#<repository>#g" $R/*.txt 2>/dev/null
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
