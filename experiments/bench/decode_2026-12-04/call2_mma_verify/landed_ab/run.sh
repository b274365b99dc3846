#!/usr/bin/env bash
# Session 8, call 2 (issue 13): commit 7ca2b3a (GDN verification dk 128, T >= 4 on the tensor cores).
# 1. test_decode_cuda on this commit's library; 2. bench A/B against 63808fe's library (alternating, 2 rounds);
# 3. the full bench table of this commit; 4. Nsight source counters of the Mamba-2 non-flush read (FP32 L = 4, 64;
# NVFP4 L = 16); 5. memcheck of the verification cases.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack2b.tar.xz
B=.device/a/bin; NEW=$PWD/.device/a/lib; OLD=$PWD/.device/a/lib_old:$PWD/.device/a/lib
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
LD_LIBRARY_PATH=$NEW $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 200 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -n 3 $R/test_decode_cuda.txt
BENCH="bench --shapes qwen3.5-4b qwen3.5-122b-a10b nemotron-3-super nemotron-3-nano-4b --batch 32 256 --window 16 --drafts 1 2 4 8"
for round in 1 2; do
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 100 $B/replayssm-bench $BENCH --csv $R/ab_new_$round.csv > $R/ab_new_$round.txt 2>&1; echo "ab new $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 100 $B/replayssm-bench $BENCH --csv $R/ab_old_$round.csv > $R/ab_old_$round.txt 2>&1; echo "ab old $round rc=$? $((SECONDS-t1))s"
done
t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/bench_main.csv > $R/bench_main.txt 2>&1; echo "bench main rc=$? $((SECONDS-t1))s"
# Nsight: per-instruction counts of the non-flush read (which instructions grow with the window position)
# The line tables name the repository root of the machine that built the library; BUILD_ROOT (optional) links
# that path to this checkout so that --import-source finds the sources (in this run both roots were the same).
if [ -n "${BUILD_ROOT:-}" ] && [ ! -e "$BUILD_ROOT" ]; then mkdir -p "$(dirname "$BUILD_ROOT")" && ln -s "$PWD" "$BUILD_ROOT"; fi
for spec in "0 4" "0 64" "6 16"; do set -- $spec; f=$1; L=$2
  t1=$SECONDS
  LD_LIBRARY_PATH=$NEW timeout 90 ncu --kernel-name-base demangled --kernel-name "regex:replay_nonflush_kernel<.*StorageFormat\)$f, \(int\)128, \(bool\)0" --launch-count 1 --section SourceCounters --section InstructionStats --section SpeedOfLight --import-source yes -f -o $R/nf_f${f}_L$L $B/replayssm-bench bench --shapes nemotron-3-super --batch 256 --window $L --arena-gib 20 --repeats 1 --no-check > $R/nf_f${f}_L$L.log 2>&1
  echo "ncu f=$f L=$L rc=$? $((SECONDS-t1))s"
  ncu -i $R/nf_f${f}_L$L.ncu-rep --page source --csv --print-source cuda,sass > $R/nf_f${f}_L${L}_source.csv 2> $R/nf_f${f}_L${L}_source.err || ncu -i $R/nf_f${f}_L$L.ncu-rep --page source --csv --print-source sass > $R/nf_f${f}_L${L}_source.csv 2>> $R/nf_f${f}_L${L}_source.err
  ncu -i $R/nf_f${f}_L$L.ncu-rep --page details > $R/nf_f${f}_L${L}_details.txt 2>&1
  wc -c $R/nf_f${f}_L${L}_source.csv; head -c 300 $R/nf_f${f}_L${L}_source.err
done
if false; then  # ran in the first attempt of this call: 0 errors
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*verification kernels equal*,*after verification commits*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
fi
grep -E "verify output-only" $R/ab_new_1.txt | cut -c1-100 | head -12
rm -f $R/*.ncu-rep; xz -9 -T8 $R/*.txt $R/*.csv $R/*.log; ls -la $R; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
