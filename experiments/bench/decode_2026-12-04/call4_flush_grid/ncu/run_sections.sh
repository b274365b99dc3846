#!/usr/bin/env bash
# Issue 13, session 9, call 5: Nsight Compute on the flush kernel (5aee9d7) where it misses <= 1.1 steps,
# beside the conventional kernel of the same shape. Text output only.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack3.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
export LD_LIBRARY_PATH=$A/lib$SYS
SEC="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats"
for shape in nemotron-3-super nemotron-3-nano-4b qwen3.5-4b; do
  t1=$SECONDS
  timeout 200 ncu --kernel-name-base demangled --kernel-name "regex:(replay_flush_kernel<.*StorageFormat\)0, \(int\)128, \(bool\)0>|conventional)" --launch-count 40 $SEC \
    $B/replayssm-bench bench --shapes $shape --batch 256 --window 16 --drafts 8 --arena-gib 20 --repeats 1 --no-check > $R/ncu_$shape.txt 2>&1
  echo "ncu $shape rc=$? $((SECONDS-t1))s"; grep -cE "^\s+Duration" $R/ncu_$shape.txt
done
xz -9 -T8 $R/*.txt; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
