#!/usr/bin/env bash
# Session 33, call 5: Nsight Compute on Nemotron-3-Nano's NVFP4 read (B = 256, L = 16) on main's library and on H7's
# (pack53: lib_land, lib_h7), to see why H7's 16-head blocks across two key heads took main's time. The launch index
# and sections are those session 29's next_ncu_nvfp4.sh had (without its --arena-gib 8, too small at B = 256: session
# 30); that script now runs this one with its own PACK, LIBS and SHAPES.
# Run from the repository root on the device: TOTAL=300 bash experiments/bench/decode_2026-12-07/session33/ncu_read.sh
# Call 6, GDN's NVFP4 reads on main's library (launch 122 is the NVFP4 read in the GDN shapes' row order too; the
# demangled name printed checks it): PACK=.device/pack52.tar.xz LIBS=lib_land SHAPES="qwen3.5-4b qwen3.5-122b-a10b" TOTAL=170 ...
# Another kernel: KERNEL (default replay_nonflush_kernel) and SKIP (launches skipped, default 122), e.g. Kimi's FP16 read
# KERNEL=kda_nonflush_kernel SKIP=110 SHAPES=kimi-linear-48b-a3b (session 28's call 2: launches 108-113 of that row).
# -> $OUT/results.tar (r/<shape>_<lib>_details.txt, _sass.csv; summarise with session28/sass_blocks.py).
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}; KERNEL=${KERNEL:-replay_nonflush_kernel}; SKIP=${SKIP:-122}
unpack_pack ${PACK:-.device/pack53.tar.xz} lib_land
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
for lib in ${LIBS:-lib_h7 lib_land}; do
  for shape in ${SHAPES:-nemotron-3-nano-4b}; do
    t0=$SECONDS; name=${shape}_${lib#lib_}
    [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "$name skipped (time)"; continue; }
    LD_LIBRARY_PATH=$A/$lib$SYS timeout -s INT 90 ncu --clock-control none --kernel-name-base function \
      -k "regex:^$KERNEL\$" --launch-skip $SKIP --launch-count 1 $NCU_PROFILE -o $R/$name $B/replayssm-bench bench --shapes $shape --batch 256 \
      --window 16 --drafts 8 --repeats 3 --no-check --timer events > $R/${name}_bench.txt 2> $R/$name.log
    echo "$name rc=$? $((SECONDS-t0))s"
    ncu_export $name "$KERNEL"
  done
done
pack_results
