#!/usr/bin/env bash
# Issue 13, session 11, call 6: wide non-flush blocks and the tensor-core NVFP4 read only on grids of >= 4
# blocks per SM (lib) against 0b5aaca (lib_base, both on grids of >= 2 blocks per SM / always):
# GPU tests, then B = 8-256 once each, alternating.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack9.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
NEW=$A/lib$SYS; OLD=$A/lib_base$SYS
LD_LIBRARY_PATH=$NEW $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 120 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
if ! grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then grep -B5 -A12 "ERROR" $R/test_decode_cuda.txt | head -40; fi
t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 90 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b --batch 8 16 32 64 128 256 --window 16 --drafts 8 --csv $R/main_new_1.csv > $R/main_new_1.txt 2>&1; echo "new rc=$? $((SECONDS-t1))s"
t1=$SECONDS; LD_LIBRARY_PATH=$OLD timeout 90 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b --batch 8 16 32 64 128 256 --window 16 --drafts 8 --csv $R/main_old_1.csv > $R/main_old_1.txt 2>&1; echo "old rc=$? $((SECONDS-t1))s"
sed -i "s#$PWD#<repository>#g" $R/*.txt 2>/dev/null
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
