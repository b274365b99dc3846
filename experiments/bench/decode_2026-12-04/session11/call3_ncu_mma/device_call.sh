#!/usr/bin/env bash
# Issue 13, session 11, call 3: source-level counters of the tensor-core LP read kernels (lib of pack6),
# Mamba-2 dk 128 Super shape B 256 L 16 h0 = L/2: NVFP4 (6) and FP16 (1); GDN NVFP4 on qwen3.5-4b.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack6.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
export LD_LIBRARY_PATH=$A/lib$SYS
S="--section SourceCounters --section WarpStateStats --section InstructionStats --section SpeedOfLight --section SchedulerStats --section Occupancy --section LaunchStats"
for spec in "0 6 nemotron-3-super" "0 1 nemotron-3-super" "1 6 qwen3.5-4b"; do
  set -- $spec
  K="regex:replay_nonflush_kernel<.*Recurrence\)$1, .*StorageFormat\)$2, \(int\)128, \(bool\)0, \(bool\)1>"
  t1=$SECONDS
  timeout 170 ncu --kernel-name-base demangled --kernel-name "$K" --launch-count 1 $S --import-source yes -o $R/src_$1_$2 \
    $B/replayssm-bench bench --shapes $3 --batch 256 --window 16 --arena-gib 20 --repeats 1 --no-check > $R/ncu_log_$1_$2.txt 2>&1
  echo "ncu $spec rc=$? $((SECONDS-t1))s"
  ncu -i $R/src_$1_$2.ncu-rep --page source --csv --print-source cuda,sass > $R/src_page_$1_$2.csv 2>&1
  ncu -i $R/src_$1_$2.ncu-rep --page details > $R/details_$1_$2.txt 2>&1
  rm -f $R/src_$1_$2.ncu-rep
done
sed -i "s|$PWD|<repository>|g" $R/*.txt $R/*.csv
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
