#!/usr/bin/env bash
# Prepared for the next session (not run): Nsight Compute on the NVFP4 reads that still miss 3.8x, on H4's library
# (pack49's lib_h4: Super's read at 16 heads per block) and on main's (lib_land), B = 256, L = 16: where the
# instructions per warp go (source page as SASS; summarise with session28/sass_blocks.py --warps N) and the usual
# sections. Launch indices of replay_nonflush_kernel with --repeats 3 (session 28's call 2): NVFP4 read 120-125.
# -> $OUT/results.tar. Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session29/next_ncu_nvfp4.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}
unpack_pack ${PACK:-.device/pack49.tar.xz} lib_land
cat $A/bin/COMMIT > $R/pack_commit.txt; cat $R/gpu.txt
SECTIONS="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats"
EXTRA=smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum
for lib in lib_h4 lib_land; do
  for shape in nemotron-3-super nemotron-3-nano-4b; do
    t0=$SECONDS; name=${shape}_${lib#lib_}
    [ $((TOTAL - SECONDS)) -lt 60 ] && { echo "$name skipped (time)"; continue; }
    LD_LIBRARY_PATH=$A/$lib$SYS timeout -s INT 60 ncu --clock-control none --kernel-name-base function \
      -k "regex:^replay_nonflush_kernel\$" --launch-skip 122 --launch-count 1 $SECTIONS --section SourceCounters \
      --section InstructionStats --metrics $EXTRA -o $R/$name $B/replayssm-bench bench --shapes $shape --batch 256 \
      --window 16 --drafts 8 --repeats 3 --no-check --timer events --arena-gib 8 > $R/${name}_bench.txt 2> $R/$name.log
    echo "$name rc=$? $((SECONDS-t0))s"
    ncu -i $R/$name.ncu-rep --page source --print-source sass --csv > $R/${name}_sass.csv 2>> $R/$name.log
    ncu -i $R/$name.ncu-rep --page details > $R/${name}_details.txt 2>&1
    rm -f $R/$name.ncu-rep
  done
done
pack_results
