#!/usr/bin/env bash
# Session 8, call 5: the chunked staging with 2 chunks in flight per thread (the bytes in flight of the pair staging)
# against 4 (c7a3f1f) and 7ca2b3a: staggered steps at B = 16, 32 slowed with 4; 3 rounds alternating.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack3.tar.xz && tar -C .device/a -xJf .device/pack4_u2.tar.xz
B=.device/a/bin; NEW=$PWD/.device/a/lib; OLD=$PWD/.device/a/lib_old:$PWD/.device/a/lib; U2=$PWD/.device/a/lib_u2:$PWD/.device/a/lib
for round in 1 2 3; do for lib in u2 new old; do case $lib in u2) LP=$U2;; new) LP=$NEW;; old) LP=$OLD;; esac
  LD_LIBRARY_PATH=$LP timeout 30 $B/replayssm-bench bench --shapes nemotron-3-nano-4b nemotron-3-super --batch 16 32 256 --window 16 --drafts 8 --csv $R/c5_${lib}_$round.csv > $R/c5_${lib}_$round.txt 2>&1; echo "$lib $round rc=$? $SECONDS"
done; done
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R
