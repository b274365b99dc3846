#!/usr/bin/env bash
# Issue 13, session 10, call 8: compute-sanitizer memcheck on the replay and verification cases at the
# final kernel code (63b39e6: the call-7 pack).
set -u
R=$OUT/r; mkdir -p $R
mkdir -p .device/a && tar -C .device/a -xJf .device/pack.tar.xz
A=$PWD/.device/a; B=$A/bin
SYS=""; if LD_LIBRARY_PATH=$A/lib ldd $B/test_decode_cuda | grep -q "not found"; then SYS=":$A/sys"; fi
t1=$SECONDS; LD_LIBRARY_PATH=$A/lib$SYS timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*staggered windows*,*appendix F skipping*,*after verification commits*,*verification kernels*" > $R/memcheck.txt 2>&1; echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
sed -i "s#$PWD#<repository>#g" $R/*.txt; xz -9 $R/*.txt; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R
