#!/usr/bin/env bash
# Issue 13, session 9, call 6: the flush step's flush kernel (all 256 sequences flushing; launches 25-36 of
# the kernel in the bench's order) and source-level counters of one staggered-step flush launch (Super).
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack3.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
export LD_LIBRARY_PATH=$A/lib$SYS
K='regex:replay_flush_kernel<.*StorageFormat\)0, \(int\)128, \(bool\)0>'
for shape in nemotron-3-super nemotron-3-nano-4b; do
  t1=$SECONDS
  timeout 150 ncu --kernel-name-base demangled --kernel-name "$K" --launch-skip 24 --launch-count 12 --section SpeedOfLight --section WarpStateStats --section InstructionStats --section SchedulerStats --section Occupancy \
    $B/replayssm-bench bench --shapes $shape --batch 256 --window 16 --drafts 8 --arena-gib 20 --repeats 1 --no-check > $R/ncu_flushstep_$shape.txt 2>&1
  echo "ncu $shape rc=$? $((SECONDS-t1))s"
done
t1=$SECONDS
timeout 200 ncu --kernel-name-base demangled --kernel-name "$K" --launch-count 1 --section SourceCounters --import-source yes -o $R/src \
  $B/replayssm-bench bench --shapes nemotron-3-super --batch 256 --window 16 --drafts 8 --arena-gib 20 --repeats 1 --no-check > $R/ncu_src_log.txt 2>&1
echo "ncu src rc=$? $((SECONDS-t1))s"
ncu -i $R/src.ncu-rep --page source --csv --print-source cuda,sass > $R/src_page.csv 2>&1; echo "export rc=$?"; rm -f $R/src.ncu-rep
sed -i "s|$PWD|<repository>|g" $R/*.txt $R/*.csv
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
