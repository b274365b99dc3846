#!/usr/bin/env bash
# Session 2026-12-04 call 1. Issue 11: long_nemotron_h's recipe alone at its bundled 3,538 steps with the text
# trace (train_alone.sh), in the background. Issue 13 beside it: the packed-bf16 GDN verification patch
# (lib) tested (test_decode_cuda, compute-sanitizer memcheck on the verification cases) while training runs;
# once training is done (quiet GPU), the bench alternating patched/committed libraries, then Nsight Compute.
# Carry: .device/call1.sh .device/train_alone.sh .device/gutenberg.tar.xz .device/pg19 .device/pack_ab.tar.xz
set -u
t0=$SECONDS
bash .device/train_alone.sh long_nemotron_h > $OUT/train_stdout.txt 2>&1 &
tp=$!
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack_ab.tar.xz
B=.device/a/bin
export LD_LIBRARY_PATH=$PWD/.device/a/lib
NEW=$PWD/.device/a/lib; OLD=$PWD/.device/a/lib_old:$PWD/.device/a/lib
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $R/gpu.txt 2>&1
$B/replayssm-bench --version > $R/version.txt 2>&1
t1=$SECONDS; timeout 200 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test_decode_cuda rc=$? $((SECONDS-t1))s"; tail -2 $R/test_decode_cuda.txt
t1=$SECONDS; timeout 200 compute-sanitizer --tool memcheck --leak-check full $B/test_decode_cuda -tc="*verification kernels equal*,*split-precision verification*,*after verification commits*" > $R/memcheck_verify.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -4 $R/memcheck_verify.txt
while kill -0 $tp 2>/dev/null; do sleep 15; echo "$((SECONDS-t0))s train: $(grep -a 'step' $OUT/logs/long_nemotron_h.log 2>/dev/null | tail -1 | cut -c1-100)"; done
wait $tp; echo "train done at $((SECONDS-t0))s"; cat $OUT/train_stdout.txt | tail -3
BENCH="bench --shapes qwen3.5-4b qwen3.5-122b-a10b nemotron-3-super nemotron-3-nano-4b --batch 32 256 --window 16 --drafts 8"
for round in 1 2; do
  [ $((SECONDS-t0)) -gt 480 ] && { echo "skip round $round (time)"; break; }
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 80 $B/replayssm-bench $BENCH --csv $R/bench_new_$round.csv > $R/bench_new_$round.txt 2>&1; echo "bench new $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 80 $B/replayssm-bench $BENCH --csv $R/bench_old_$round.csv > $R/bench_old_$round.txt 2>&1; echo "bench old $round rc=$? $((SECONDS-t1))s"
done
for f in bench_new_1 bench_old_1 bench_new_2 bench_old_2; do [ -f $R/$f.txt ] && { echo "== $f"; grep -E "^\|" $R/$f.txt | grep -E "verif" | cut -c1-130; }; done
NCU="ncu --kernel-name regex:verify_kernel --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section WarpStateStats"
ONE="bench --shapes qwen3.5-4b --batch 256 --window 16 --drafts 8 --arena-gib 8"
if [ $((SECONDS-t0)) -lt 500 ]; then
  LD_LIBRARY_PATH=$NEW timeout 45 $NCU $B/replayssm-bench $ONE > $R/ncu_new.txt 2>&1; echo "ncu new rc=$?"
  LD_LIBRARY_PATH=$OLD timeout 45 $NCU $B/replayssm-bench $ONE > $R/ncu_old.txt 2>&1; echo "ncu old rc=$?"
fi
tar -C $OUT -czf $OUT/results.tgz r && rm -rf $R; ls -la $OUT; echo "total $((SECONDS-t0))s"
