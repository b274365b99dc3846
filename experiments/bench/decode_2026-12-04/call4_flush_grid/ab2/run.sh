#!/usr/bin/env bash
# Issue 13, session 9, call 2: round 2 of the A/B, and the flush kernel's heads per block swept
# (EXPERIMENT_FLUSH_NH: the largest allowed value <= it; experiment-only library lib_v1env).
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack2.tar.xz
A=$PWD/.device/a; B=$A/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
SYS=""
if LD_LIBRARY_PATH=$A/lib_base ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
lib() { echo "$A/lib_$1$SYS"; }
t0=$SECONDS
[ "${SKIP_TEST:-0}" = 1 ] && cp .device/test_v1.txt $R/ 2>/dev/null; [ "${SKIP_TEST:-0}" = 1 ] || t0=$SECONDS; [ "${SKIP_TEST:-0}" = 1 ] || LD_LIBRARY_PATH=$(lib v1) timeout 240 $B/test_decode_cuda > $R/test_v1.txt 2>&1; echo "test v1 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_v1.txt | head -n 2 | tr '\n' ' ')"
if ! grep -q "Status: SUCCESS" $R/test_v1.txt; then grep -B5 -A20 "ERROR" $R/test_v1.txt | head -60; fi
S="--shapes nemotron-3-nano-4b nemotron-3-super qwen3.5-4b qwen3.5-122b-a10b --batch 8 16 32 64 128 256 --window 16 --drafts 8"
run() {  # name lib [env]
  t1=$SECONDS; env ${3:-} LD_LIBRARY_PATH=$(lib $2) timeout 150 $B/replayssm-bench bench $S --csv $R/ab_$1.csv > $R/ab_$1.txt 2>&1; echo "bench $1 rc=$? $((SECONDS-t1))s"
}
run base_1 base; run v1_1 v1; run grid_1 grid
run nh1_1 v1env EXPERIMENT_FLUSH_NH=1; run nh2_1 v1env EXPERIMENT_FLUSH_NH=2; run nh4_1 v1env EXPERIMENT_FLUSH_NH=4
run v1_2 v1; run base_2 base
if grep -q "Status: SUCCESS" $R/test_v1.txt; then
  t1=$SECONDS; LD_LIBRARY_PATH=$(lib v1) timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*staggered windows*,*appendix F skipping*,*after verification commits*,*verification kernels*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
fi
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
