#!/usr/bin/env bash
# Session 2026-12-03 (4), call 2: KDA kernels with shared-memory LP vectors and a 2-row flush prefetch;
# tests first, then every shape's targets in one bench run, then Nsight Compute on the KDA kernels.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack.tar.xz
B=.device/a/bin
export LD_LIBRARY_PATH=$PWD/.device/a/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
$B/replayssm-bench --version > $R/version.txt 2>&1
t0=$SECONDS; timeout 120 $B/test_decode_kda_cuda > $R/test_decode_kda_cuda.txt 2>&1; echo "test_decode_kda_cuda rc=$? $((SECONDS-t0))s"; tail -2 $R/test_decode_kda_cuda.txt
t0=$SECONDS; timeout 100 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -2 $R/test_decode_cuda.txt
t0=$SECONDS; timeout 150 $B/replayssm-bench bench --batch 8 32 256 --window 16 --drafts 8 --csv $R/bench_all.csv > $R/bench_all.txt 2>&1; echo "bench all rc=$? $((SECONDS-t0))s"
grep -E "^\|" $R/bench_all.txt | grep -E "kimi" | grep -E "\|  256 \|" | cut -c1-130
SEC="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
BENCH="$B/replayssm-bench bench --shapes kimi-linear-48b-a3b --batch 256 --window 16 --drafts 8 --repeats 1 --no-check --arena-gib 24"
i=0
for k in "kda_nonflush_kernel<.*StorageFormat.0, .int.128" "kda_nonflush_kernel<.*StorageFormat.6, .int.128" "kda_flush_kernel<.*StorageFormat.0, .int.128"; do
  i=$((i+1)); t0=$SECONDS
  timeout -s INT 60 ncu --clock-control none --kernel-name-base demangled -k "regex:$k" -c 3 $SEC --csv --page details \
    --log-file $R/ncu_kda_$i.csv $BENCH > $R/ncu_bench_$i.txt 2>&1
  echo "ncu $i rc=$? $((SECONDS-t0))s lines=$(wc -l < $R/ncu_kda_$i.csv)"
done
tar -C $OUT -czf $OUT/results.tgz r && rm -rf $R
