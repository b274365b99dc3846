#!/usr/bin/env bash
# Session 2026-12-03 (5), issue 13: KDA verification with the reduce-scatter row sums
# (experiments/bench/decode_2026-12-03c/attempts/kda_verify_scatter_sums.patch) against the committed
# library (lib_old = cuda/ as at 47a072b) in the same call: tests first, then the Kimi bench alternating.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack.tar.xz
B=.device/a/bin
export LD_LIBRARY_PATH=$PWD/.device/a/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
$B/replayssm-bench --version > $R/version.txt 2>&1
t0=$SECONDS; timeout 120 $B/test_decode_kda_cuda > $R/test_decode_kda_cuda.txt 2>&1; echo "test_decode_kda_cuda rc=$? $((SECONDS-t0))s"; tail -2 $R/test_decode_kda_cuda.txt
t0=$SECONDS; timeout 100 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -2 $R/test_decode_cuda.txt
BENCH="bench --shapes kimi-linear-48b-a3b --batch 8 32 256 --window 16 --drafts 8"
for round in 1 2; do
  t0=$SECONDS; timeout 60 $B/replayssm-bench $BENCH --csv $R/bench_new_$round.csv > $R/bench_new_$round.txt 2>&1; echo "bench new $round rc=$? $((SECONDS-t0))s"
  t0=$SECONDS; LD_LIBRARY_PATH=$PWD/.device/a/lib_old:$PWD/.device/a/lib timeout 60 $B/replayssm-bench $BENCH --csv $R/bench_old_$round.csv > $R/bench_old_$round.txt 2>&1; echo "bench old $round rc=$? $((SECONDS-t0))s"
done
for f in bench_new_1 bench_old_1 bench_new_2 bench_old_2; do echo "== $f"; grep -E "^\|" $R/$f.txt | grep -E "verif" | cut -c1-130; done
tar -C $OUT -czf $OUT/results.tgz r && rm -rf $R
