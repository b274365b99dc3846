#!/usr/bin/env bash
# Session 21, last device call (about TOTAL = 300 s), main's library (pack24's lib_e3 = c0706f0's):
# 1. on an H200 only: both decode suites and 2 record rounds of every shape at B = 32 and 256 (the run of record for
#    the session's landings); on another card this part is skipped (calls 3 and 4 measured it on the H100);
# 2. where Super's NVFP4 read spends its instructions: Nsight Compute's SourceCounters on one launch of
#    replay_nonflush_kernel<mamba2, nvfp4, 128, false, true> (B = 256), per SASS instruction with its CUDA line
#    (-lineinfo build), `--page source --print-source cuda,sass --csv`; the details page as well, in case the
#    source page is not printed. The NVFP4 read takes the same time on the H100 and the H200 (issue-bound), so
#    either card answers this part.
# 3. a probe (no code change): the non-flush reads with twice the heads per block (Super 16 x 64 rows, Nano 12 x 80),
#    which shares the block's fixed work (prologue, key products, B table) over twice the rows, against the
#    launcher's choice (8 heads), 2 alternating rounds. Forcing it sets the flush kernel's heads too; the
#    `non-flush read` rows run no flush.
# -> $OUT/results.tar. Run from the repository root: TOTAL=300 bash experiments/bench/decode_2026-12-06/session21/call5.sh
source experiments/bench/decode_2026-12-05/device_common.sh
TOTAL=${TOTAL:-300}; LIB=${LIB:-lib_e3}
unpack_pack ${PACK:-.device/pack24.tar.xz} $LIB
LP=$A/$LIB$SYS
LD_LIBRARY_PATH=$LP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt $R/gpu.txt
if grep -q H200 $R/gpu.txt; then
  for t in test_decode_cuda test_decode_kda_cuda; do t0=$SECONDS
    LD_LIBRARY_PATH=$LP timeout 100 $B/$t > $R/$t.txt 2>&1
    echo "$t rc=$? $((SECONDS-t0))s $(tail -n 3 $R/$t.txt | head -n 2 | tr '\n' ' ')"
  done
  for round in 1 2; do t0=$SECONDS
    LD_LIBRARY_PATH=$LP timeout 80 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b qwen3.5-4b \
      qwen3.5-122b-a10b kimi-linear-48b-a3b --batch 32 256 --window 16 --drafts 8 --csv $R/record_$round.csv \
      > $R/record_$round.txt 2>&1
    echo "record $round rc=$? $((SECONDS-t0))s"
  done
fi
for round in 1 2; do
  for nh in 0 wide; do t0=$SECONDS
    for shape in nemotron-3-super:16 nemotron-3-nano-4b:12; do
      hpb=$([ $nh = wide ] && echo ${shape#*:} || echo 0)
      LD_LIBRARY_PATH=$LP timeout 60 $B/replayssm-bench bench --shapes ${shape%:*} --batch 32 256 --window 16 --drafts 8 \
        --heads-per-block $hpb --csv $R/nh_${nh}_${shape%:*}_$round.csv > $R/nh_${nh}_${shape%:*}_$round.txt 2>&1
    done
    echo "heads per block $nh round $round rc=$? $((SECONDS-t0))s"
  done
done
# compute-sanitizer on the conventional cases (E3's KDA prefetch, F's 2 x 40-row split), on any card
for t in test_decode_cuda test_decode_kda_cuda; do t0=$SECONDS
  LD_LIBRARY_PATH=$LP timeout 90 compute-sanitizer --tool memcheck $B/$t -tc="*onventional decode kernels*" \
    > $R/memcheck_conv_$t.txt 2>&1
  echo "memcheck conventional $t rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_conv_$t.txt)"
done
grep -h "non-flush read" $R/nh_*_1.txt | grep "|  256 |" | cut -c1-140
t0=$SECONDS
LD_LIBRARY_PATH=$LP timeout -s INT $((TOTAL - SECONDS - 20)) ncu --clock-control none --kernel-name-base function \
  --print-kernel-base demangled -k "regex:^replay_nonflush_kernel\$" --launch-skip 120 --launch-count 1 \
  --section SourceCounters --section InstructionStats -o $R/nvfp4_source $B/replayssm-bench bench \
  --shapes nemotron-3-super --batch 256 --window 16 --drafts 8 --repeats 3 --no-check --arena-gib 24 \
  > $R/nvfp4_source.log 2>&1
echo "ncu source rc=$? $((SECONDS-t0))s"; tail -n 3 $R/nvfp4_source.log
if [ -f $R/nvfp4_source.ncu-rep ]; then
  ncu -i $R/nvfp4_source.ncu-rep --page source --print-source cuda,sass --csv > $R/nvfp4_source_sass.csv 2> $R/nvfp4_source_sass.log
  echo "source page rc=$? $(wc -l < $R/nvfp4_source_sass.csv) lines"
  ncu -i $R/nvfp4_source.ncu-rep --page details --csv > $R/nvfp4_source_details.csv 2>&1
  echo "details page rc=$? $(wc -l < $R/nvfp4_source_details.csv) lines"
  xz -T4 -6 $R/nvfp4_source.ncu-rep
fi
pack_results
