#!/usr/bin/env bash
# Issue 13, session 10, call 7: the launchers' step_blocks guard; test_decode_cuda (replay, verification,
# CUDA Graphs cases all launch through replay_step) must still pass.
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/test_decode_cuda | grep -q "not found"; then SYS=":$A/sys"; fi
t0=$SECONDS; LD_LIBRARY_PATH=$A/lib$SYS timeout 240 $B/test_decode_cuda > $R/test_decode_cuda.txt 2>&1; echo "test rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_decode_cuda.txt | head -n 2 | tr '\n' ' ')"
if ! grep -q "Status: SUCCESS" $R/test_decode_cuda.txt; then grep -B5 -A25 "ERROR" $R/test_decode_cuda.txt | head -60; fi
sed -i "s#$PWD#<repository>#g" $R/*.txt; xz -9 $R/*.txt; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R
