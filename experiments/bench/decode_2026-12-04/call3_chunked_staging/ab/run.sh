#!/usr/bin/env bash
# Session 8, call 3 (issue 13): commit c7a3f1f (non-flush read: chunked record staging, no division per row)
# against 7ca2b3a's library. 1. test_decode_cuda; 2. full bench, alternating (2 rounds each); 3. Nsight instruction
# counts of the Mamba-2 non-flush read (FP32 L = 64, NVFP4 L = 16, FP16 L = 16), both libraries; 4. memcheck (replay cases).
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack3.tar.xz
B=.device/a/bin; NEW=$PWD/.device/a/lib; OLD=$PWD/.device/a/lib_old:$PWD/.device/a/lib
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
LD_LIBRARY_PATH=$NEW $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 200 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test_decode_cuda rc=$? $((SECONDS-t0))s"; tail -n 3 $R/test_decode_cuda.txt
if ! grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then grep -B5 -A20 "ERROR" $R/test_decode_cuda.txt | head -80; fi
for round in 1 2; do
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 100 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/main_new_$round.csv > $R/main_new_$round.txt 2>&1; echo "main new $round rc=$? $((SECONDS-t1))s"
  t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 100 $B/replayssm-bench bench --batch 32 256 --window 16 --drafts 8 --csv $R/main_old_$round.csv > $R/main_old_$round.txt 2>&1; echo "main old $round rc=$? $((SECONDS-t1))s"
done
for lib in new old; do [ $lib = new ] && LP=$NEW || LP=$OLD
  for spec in "0 64" "6 16" "1 16" "0 16"; do set -- $spec
    LD_LIBRARY_PATH=$LP timeout 40 ncu --kernel-name-base demangled --kernel-name "regex:replay_nonflush_kernel<.*StorageFormat\)$1, \(int\)128, \(bool\)0" --launch-count 1 --section SpeedOfLight --section InstructionStats $B/replayssm-bench bench --shapes nemotron-3-super --batch 256 --window $2 --arena-gib 20 --repeats 1 --no-check > $R/ncu_${lib}_f$1_L$2.txt 2>&1
    echo "ncu $lib f=$1 L=$2 rc=$? $(grep -E '^\s+(Duration|Executed Instructions|Elapsed Cycles) ' $R/ncu_${lib}_f$1_L$2.txt | tr -s ' ' | tr '\n' ' ')"
  done
done
if grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 120 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*staggered windows*,*appendix F skipping*,*after verification commits*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
fi
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
