#!/usr/bin/env bash
# Issue 13, session 9, call 1: flush-kernel grid (heads per block for the flushing sequences) and
# rotated warp tasks, verification/flush chunked staging; A/B against HEAD's library.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack.tar.xz
A=$PWD/.device/a; B=$A/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
SYS=""
if LD_LIBRARY_PATH=$A/lib_base ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
LD_LIBRARY_PATH=$A/lib_base$SYS ldd $B/replayssm-bench | grep "not found" > $R/ldd_missing.txt
lib() { echo "$A/lib_$1$SYS"; }
LD_LIBRARY_PATH=$(lib task) $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
for v in task all grid; do
  filt=(); [ $v = grid ] && filt=('-tc=*staggered windows*,*after verification commits*,*appendix F*')
  t0=$SECONDS; LD_LIBRARY_PATH=$(lib $v) timeout 240 $B/test_decode_cuda "${filt[@]}" > $R/test_$v.txt 2>&1; echo "test $v rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_$v.txt | head -n 2 | tr '\n' ' ')"
  if ! grep -q "Status: SUCCESS" $R/test_$v.txt; then grep -B5 -A20 "ERROR" $R/test_$v.txt | head -60; fi
done
round=${ROUND:-1}
for v in base grid task all; do
  t1=$SECONDS; LD_LIBRARY_PATH=$(lib $v) timeout 150 $B/replayssm-bench bench --shapes nemotron-3-nano-4b nemotron-3-super qwen3.5-4b --batch 16 32 256 --window 16 --drafts 8 --csv $R/ab_${v}_$round.csv > $R/ab_${v}_$round.txt 2>&1; echo "bench $v $round rc=$? $((SECONDS-t1))s"
done
if [ "${MEMCHECK:-1}" = 1 ] && grep -q "Status: SUCCESS" $R/test_all.txt; then
  t1=$SECONDS; LD_LIBRARY_PATH=$(lib all) timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*staggered windows*,*appendix F skipping*,*after verification commits*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
fi
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
