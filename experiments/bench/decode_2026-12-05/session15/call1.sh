#!/usr/bin/env bash
# Session 15, call 1: KDA non-flush blocks that issue every load at their start (records by cp.async; the
# read checkpoint's head staged whole in shared memory by cp.async where two blocks still fit an SM), and KDA
# flush blocks that stage their recur head the same way.
# Pack .device/pack15a.tar.xz: bin/ (main's test binaries and bench, as in pack14h), lib_main/ (main's library),
# lib_exp/ (the change; with REPLAYSSM_KDA_NO_STAGED_STATE and REPLAYSSM_KDA_NO_STAGED_FLUSH set, its launchers
# keep the register streams, so the records-only part is measured from the same library), sys/.
# Run from the repository root on the device machine: bash experiments/bench/decode_2026-12-05/session15/call1.sh
source "$(dirname "$0")/../device_common.sh"
unpack_pack .device/pack15a.tar.xz lib_main
MAIN=$A/lib_main$SYS; EXP=$A/lib_exp$SYS
LD_LIBRARY_PATH=$EXP $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
ok=1
t0=$SECONDS; LD_LIBRARY_PATH=$EXP timeout 200 $B/test_decode_kda_cuda > $R/test_kda_staged.txt 2>&1
echo "test kda staged rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_kda_staged.txt | head -n 2 | tr '\n' ' ')"
grep -q "Status: SUCCESS" $R/test_kda_staged.txt || ok=0
t0=$SECONDS; REPLAYSSM_KDA_NO_STAGED_STATE=1 REPLAYSSM_KDA_NO_STAGED_FLUSH=1 LD_LIBRARY_PATH=$EXP timeout 120 $B/test_decode_kda_cuda -tc="*ReplaySSM*,*after verification*" \
  > $R/test_kda_records_only.txt 2>&1
echo "test kda records-only rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_kda_records_only.txt | head -n 2 | tr '\n' ' ')"
grep -q "Status: SUCCESS" $R/test_kda_records_only.txt || ok=0
if [ $ok = 1 ]; then
  for round in 1 2; do
    for v in staged records main; do L=$EXP; [ $v = main ] && L=$MAIN; t0=$SECONDS
      if [ $v = records ]; then export REPLAYSSM_KDA_NO_STAGED_STATE=1 REPLAYSSM_KDA_NO_STAGED_FLUSH=1
      else unset REPLAYSSM_KDA_NO_STAGED_STATE REPLAYSSM_KDA_NO_STAGED_FLUSH; fi
      LD_LIBRARY_PATH=$L timeout 100 $B/replayssm-bench bench --shapes kimi-linear-48b-a3b --batch 32 256 --window 16 --drafts 8 \
        --csv $R/kimi_${v}_$round.csv > $R/kimi_${v}_$round.txt 2>&1
      echo "bench $v $round rc=$? $((SECONDS-t0))s"
    done
  done
  unset REPLAYSSM_KDA_NO_STAGED_STATE REPLAYSSM_KDA_NO_STAGED_FLUSH
  grep -h "conventional fp32\|replay fp32\|read nvfp4\|read fp16\|read fp8" $R/kimi_*_1.txt | grep "|  256 |" | cut -c1-130
  t0=$SECONDS; LD_LIBRARY_PATH=$EXP timeout 150 compute-sanitizer --tool memcheck $B/test_decode_kda_cuda \
    -tc="*ReplaySSM decode kernels equal*,*appendix F*" > $R/memcheck.txt 2>&1
  echo "memcheck rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck.txt)"
  t0=$SECONDS; LD_LIBRARY_PATH=$EXP timeout 120 compute-sanitizer --tool racecheck $B/test_decode_kda_cuda \
    -tc="*ReplaySSM decode kernels equal*" > $R/racecheck.txt 2>&1
  echo "racecheck rc=$? $((SECONDS-t0))s $(tail -n 1 $R/racecheck.txt)"
  # Nsight Compute on the staged FP32 non-flush kernel: a step of the staggered row (launch 9 of 96).
  if [ $SECONDS -lt 470 ]; then t0=$SECONDS
    LD_LIBRARY_PATH=$EXP timeout -s INT 90 ncu --clock-control none --kernel-name-base demangled \
      -k "regex:kda_nonflush_kernel<[^,]*0, [^,]*128, [^,]*(1|true)>" -s 8 -c 1 \
      --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
      --import-source yes -o $R/src_nf32 $B/replayssm-bench bench --shapes kimi-linear-48b-a3b --batch 256 --window 16 --drafts 8 \
      --repeats 1 --no-check --arena-gib 24 > $R/ncu_log_nf32.txt 2>&1
    echo "ncu rc=$? $((SECONDS-t0))s"
    ncu -i $R/src_nf32.ncu-rep --page source --csv --print-source cuda,sass > $R/src_page_nf32.csv 2>&1
    ncu -i $R/src_nf32.ncu-rep --page details > $R/details_nf32.txt 2>&1
    rm -f $R/src_nf32.ncu-rep
  fi
fi
pack_results
