#!/usr/bin/env bash
# Issue 13, session 9, call 8: 5aee9d7's standard step with the heads per block forced (1, 2) against the
# automatic choice, B = 16, 32, 64: is the non-flush kernel short of parallelism at small B? (data only)
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack3.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
export LD_LIBRARY_PATH=$A/lib$SYS
S="--shapes nemotron-3-nano-4b nemotron-3-super qwen3.5-4b qwen3.5-122b-a10b --batch 16 32 64 --window 16 --drafts 8"
for h in 0 1 2; do
  t1=$SECONDS; timeout 100 $B/replayssm-bench bench $S --heads-per-block $h --csv $R/hpb$h.csv > $R/hpb$h.txt 2>&1; echo "hpb $h rc=$? $((SECONDS-t1))s"
done
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
