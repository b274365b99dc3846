#!/usr/bin/env bash
# Issue 13: how the non-flush read's instruction count splits between the per-block record phase (grows with
# the window position h) and the state stream (fixed): Nsight Compute on the Mamba-2 non-flush kernel at
# L = 4, 16, 64 (the bench's non-flush step sits at h = L/2) for FP32, FP16 and NVFP4 reads, Nemotron-3-Super, B = 256.
set -u
mkdir -p .device/a && tar -C .device/a -xJf .device/pack_ab.tar.xz; B=.device/a/bin
export LD_LIBRARY_PATH=$PWD/.device/a/lib_old:$PWD/.device/a/lib
for L in 4 16 64; do for f in 0 1 6; do
  timeout 60 ncu --kernel-name-base demangled --kernel-name "regex:replay_nonflush_kernel<.*StorageFormat\)$f, \(int\)128, \(bool\)0" --launch-count 2 --section SpeedOfLight --section InstructionStats --section ComputeWorkloadAnalysis $B/replayssm-bench bench --shapes nemotron-3-super --batch 256 --window $L --arena-gib 20 --repeats 1 --no-check > $OUT/ncu_L${L}_f$f.txt 2>&1
  echo "L=$L f=$f rc=$? $(grep -E '^\s+(Duration|Executed Instructions) ' $OUT/ncu_L${L}_f$f.txt | tr -s ' ' | tr '\n' ' ')"
done; done
xz -9 $OUT/*.txt
