#!/usr/bin/env bash
# Session 2026-12-03 (4): KDA kernels (staged records, checkpoint prefetch, flush first) against the
# previous library in the same call; tests and sanitizers first.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack.tar.xz
B=.device/a/bin
export LD_LIBRARY_PATH=$PWD/.device/a/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
$B/replayssm-bench --version > $R/version.txt 2>&1
t0=$SECONDS; timeout 120 $B/test_decode_kda_cuda > $R/test_decode_kda_cuda.txt 2>&1; echo "test_decode_kda_cuda rc=$? $((SECONDS-t0))s"; tail -2 $R/test_decode_kda_cuda.txt
t0=$SECONDS; timeout 90 compute-sanitizer --tool memcheck --leak-check full $B/test_decode_kda_cuda -tc="*shared fp32 and split*,*verification kernels equal*,*after verification commits*" > $R/memcheck_kda.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t0))s"; tail -3 $R/memcheck_kda.txt
t0=$SECONDS; timeout 120 compute-sanitizer --tool racecheck $B/test_decode_kda_cuda -tc="*shared fp32 and split*,*verification kernels equal*" > $R/racecheck_kda.txt 2>&1; echo "racecheck rc=$? $((SECONDS-t0))s"; tail -3 $R/racecheck_kda.txt
BENCH="bench --shapes kimi-linear-48b-a3b --batch 8 32 256 --window 16 --drafts 8"
for round in 1 2; do
  t0=$SECONDS; timeout 60 $B/replayssm-bench $BENCH --csv $R/bench_new_$round.csv > $R/bench_new_$round.txt 2>&1; echo "bench new $round rc=$? $((SECONDS-t0))s"
  t0=$SECONDS; LD_LIBRARY_PATH=$PWD/.device/a/lib_old:$PWD/.device/a/lib timeout 60 $B/replayssm-bench $BENCH --csv $R/bench_old_$round.csv > $R/bench_old_$round.txt 2>&1; echo "bench old $round rc=$? $((SECONDS-t0))s"
done
for f in bench_new_2 bench_old_2; do echo "== $f"; grep -E "^\|" $R/$f.txt | grep -E "kimi" | cut -c1-130; done
tar -C $OUT -czf $OUT/results.tgz r && rm -rf $R
