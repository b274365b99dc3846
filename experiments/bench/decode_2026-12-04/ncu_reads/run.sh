#!/usr/bin/env bash
# Session 2026-12-04, calls 6 and 7 (issue 13): Nsight Compute on the committed kernels (lib_old of
# .device/pack_ab.tar.xz, `--version` 47a072b18442-dirty = cuda/ of 886ab22), Nemotron-3-Super shape.
# Formats: 0 FP32, 1 FP16, 5 FP8-b128, 6 NVFP4 (StorageFormat). The bench ran with its validation on, so
# the profiled launches (the 2nd and 3rd of each kernel) are validation launches from zero states.
# The flush profile caught only the small staggered-validation launches (about 18 us, a few sequences
# flushing), not the all-flush step; its conventional-kernel rows are the useful part.
B=.device/a/bin
export LD_LIBRARY_PATH=$PWD/.device/a/lib_old:$PWD/.device/a/lib
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section SchedulerStats"
for f in 0 1 5 6; do
  ncu --kernel-name-base demangled --kernel-name "regex:replay_nonflush_kernel<.*StorageFormat\)$f, \(int\)128, \(bool\)0" \
      --launch-skip 1 --launch-count 2 $S $B/replayssm-bench bench --shapes nemotron-3-super --batch 256 --window 16 --arena-gib 20 > ncu_lp_$f.txt
done
for sh in nemotron-3-super nemotron-3-nano-4b; do
  ncu --kernel-name-base demangled --kernel-name "regex:(replay_flush_kernel<.*StorageFormat\)0, \(int\)128, \(bool\)0|conventional_kernel<.*StorageFormat\)0, \(int\)128, \(bool\)0)" \
      --launch-skip 2 --launch-count 4 $S $B/replayssm-bench bench --shapes $sh --batch 256 --window 16 --arena-gib 20 > ncu_flush_$sh.txt
done
