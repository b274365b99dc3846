#!/usr/bin/env bash
# Issue 13, session 11, call 1: source-level counters of the low-precision non-flush read kernels
# (Mamba-2, dk 128, Super shape, B 256, L 16, h0 = L/2): FP16 (1), FP8-b128 (5), NVFP4 (6).
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack5.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
export LD_LIBRARY_PATH=$A/lib$SYS
$B/replayssm-bench --version > $R/version.txt 2>&1
nvidia-smi > $R/gpu.txt 2>&1
for f in 6 1 5; do
  K="regex:replay_nonflush_kernel<.*StorageFormat\)$f, \(int\)128, \(bool\)0>"
  t1=$SECONDS
  timeout 170 ncu --kernel-name-base demangled --kernel-name "$K" --launch-count 1 --section SourceCounters --section WarpStateStats --section InstructionStats --section SpeedOfLight --section SchedulerStats --section Occupancy --import-source yes -o $R/src_$f \
    $B/replayssm-bench bench --shapes nemotron-3-super --batch 256 --window 16 --arena-gib 20 --repeats 1 --no-check > $R/ncu_log_$f.txt 2>&1
  echo "ncu $f rc=$? $((SECONDS-t1))s"
  ncu -i $R/src_$f.ncu-rep --page source --csv --print-source cuda,sass > $R/src_page_$f.csv 2>&1
  ncu -i $R/src_$f.ncu-rep --page details > $R/details_$f.txt 2>&1
  echo "export rc=$?"; rm -f $R/src_$f.ncu-rep
done
sed -i "s|$PWD|<repository>|g" $R/*.txt $R/*.csv
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
