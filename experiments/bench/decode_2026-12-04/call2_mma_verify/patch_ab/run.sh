#!/usr/bin/env bash
# Next session (issue 13): the verification stream on the tensor cores (m16n8k8 TF32, hi + lo split;
# experiments/bench/decode_2026-12-04/attempts/verify_stream_tf32_mma.patch) against the committed library.
# Pack (.device/pack_mma.tar.xz, 29.5 MB, built 2026-12-04 from f6accf6): bin/{test_decode_cuda,replayssm-bench},
# lib/ (verify_stream_tf32_mma.patch + libfmt), lib_v2/ (verify_stream_and_fold_tf32_mma.patch: the flush fold on the
# tensor cores too), lib_fp8/ (nonflush_fp8_mamba2_three_blocks.patch: the Mamba-2 FP8 read at 3 blocks/SM, no spill),
# lib_old/ (f6accf6's). Carry: .device/mma_verify_ab.sh .device/pack_mma.tar.xz
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack_mma.tar.xz
B=.device/a/bin
NEW=$PWD/.device/a/lib; V2=$PWD/.device/a/lib_v2:$PWD/.device/a/lib; FP8=$PWD/.device/a/lib_fp8:$PWD/.device/a/lib; OLD=$PWD/.device/a/lib_old:$PWD/.device/a/lib
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
t0=$SECONDS
LD_LIBRARY_PATH=$NEW timeout 200 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -3 $R/test_decode_cuda.txt
grep -E "verify|FAILED|ERROR" $R/test_decode_cuda.txt | head -20
t0=$SECONDS; LD_LIBRARY_PATH=$V2 timeout 200 $B/test_decode_cuda > $R/test_decode_cuda_v2.txt 2>&1; echo "test_decode_cuda v2 rc=$? $((SECONDS-t0))s"; tail -3 $R/test_decode_cuda_v2.txt
BENCH="bench --shapes qwen3.5-4b qwen3.5-122b-a10b nemotron-3-super nemotron-3-nano-4b --batch 32 256 --window 16 --drafts 1 2 4 8"
for round in 1 2; do
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 100 $B/replayssm-bench $BENCH --csv $R/bench_new_$round.csv > $R/bench_new_$round.txt 2>&1; echo "bench new $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$V2 timeout 100 $B/replayssm-bench $BENCH --csv $R/bench_v2_$round.csv > $R/bench_v2_$round.txt 2>&1; echo "bench v2 $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 100 $B/replayssm-bench $BENCH --csv $R/bench_old_$round.csv > $R/bench_old_$round.txt 2>&1; echo "bench old $round rc=$? $((SECONDS-t1))s"
done
# the FP8 launch bound: Mamba-2 shapes, non-flush reads, alternating with the committed library
M2="bench --shapes nemotron-3-super nemotron-3-nano-4b --batch 32 256 --window 16 --drafts 8"
for round in 1 2; do
  LD_LIBRARY_PATH=$FP8 timeout 60 $B/replayssm-bench $M2 --csv $R/m2_fp8_$round.csv > $R/m2_fp8_$round.txt 2>&1; echo "m2 fp8 $round rc=$?"
  LD_LIBRARY_PATH=$OLD timeout 60 $B/replayssm-bench $M2 --csv $R/m2_old_$round.csv > $R/m2_old_$round.txt 2>&1; echo "m2 old $round rc=$?"
done
grep -h "non-flush read" $R/m2_fp8_1.txt $R/m2_old_1.txt | cut -c1-110
for f in bench_new_1 bench_v2_1 bench_old_1; do echo "== $f"; grep -E "^\|" $R/$f.txt | grep -E "verify output-only|conventional fp32 " | cut -c1-120; done
NCU="ncu --kernel-name-base demangled --kernel-name regex:::verify_kernel< --launch-count 2 --section SpeedOfLight --section InstructionStats --section ComputeWorkloadAnalysis --section Occupancy --section MemoryWorkloadAnalysis"
ONE="bench --shapes qwen3.5-4b --batch 256 --window 16 --drafts 8 --arena-gib 20 --repeats 1 --no-check"
LD_LIBRARY_PATH=$NEW timeout 60 $NCU $B/replayssm-bench $ONE > $R/ncu_new.txt 2>&1; echo "ncu new rc=$?"
LD_LIBRARY_PATH=$V2 timeout 60 $NCU $B/replayssm-bench $ONE > $R/ncu_v2.txt 2>&1; echo "ncu v2 rc=$?"
LD_LIBRARY_PATH=$OLD timeout 60 $NCU $B/replayssm-bench $ONE > $R/ncu_old.txt 2>&1; echo "ncu old rc=$?"
# if the tests passed: memcheck + racecheck on the verification cases with the patched library
if grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then
  LD_LIBRARY_PATH=$NEW timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*verification kernels equal*,*after verification commits*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$?"; tail -2 $R/memcheck.txt
fi
xz -9 $R/*.txt; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R
