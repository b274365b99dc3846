#!/usr/bin/env bash
# Session 8, call 4: Nemotron-3-Nano B = 32 staggered step, c7a3f1f vs 7ca2b3a (7% slower in call 3 while its
# non-flush step got 7% faster): batch dependence (3 rounds alternating) and Nsight durations of both kernels.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack3.tar.xz
B=.device/a/bin; NEW=$PWD/.device/a/lib; OLD=$PWD/.device/a/lib_old:$PWD/.device/a/lib
for round in 1 2 3; do for lib in new old; do [ $lib = new ] && LP=$NEW || LP=$OLD
  LD_LIBRARY_PATH=$LP timeout 60 $B/replayssm-bench bench --shapes nemotron-3-nano-4b nemotron-3-super --batch 8 16 32 64 128 --window 16 --drafts 8 --csv $R/nano_${lib}_$round.csv > $R/nano_${lib}_$round.txt 2>&1; echo "$lib $round rc=$?"
done; done
for lib in new old; do [ $lib = new ] && LP=$NEW || LP=$OLD
  LD_LIBRARY_PATH=$LP timeout 60 ncu --kernel-name-base demangled --kernel-name "regex:replay_(non)?flush_kernel<.*StorageFormat\)0, \(int\)128, \(bool\)0" --launch-skip 0 --launch-count 6 --section SpeedOfLight --section LaunchStats --section Occupancy --section InstructionStats $B/replayssm-bench bench --shapes nemotron-3-nano-4b --batch 32 --window 16 --drafts 1 --arena-gib 20 --repeats 1 --no-check > $R/ncu_nano32_$lib.txt 2>&1; echo "ncu $lib rc=$?"
  grep -E "replay_|Duration|Executed Instructions |Registers Per|Achieved Occ|Grid Size" $R/ncu_nano32_$lib.txt | head -40
done
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R
