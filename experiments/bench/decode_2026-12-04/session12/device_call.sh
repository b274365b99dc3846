#!/usr/bin/env bash
# Issue 13, prepared in session 12 (no device time then): the window's records staged by cp.async.
# Pack: .device/pack12.tar.xz (bin/ = 4cbd562's test and bench, lib_base/ = 7d89d8f, lib_records/ = nonflush_record_pieces.patch,
# lib_all/ = records_pieces_nonflush_and_flush.patch, sys/; how to rebuild it: README.md of this folder).
# `verify` uses .device/pack12v.tar.xz instead (bin/, lib_all/, lib_verify/ = records_pieces_and_verify_flush_tiles.patch,
# lib_verify_gdn/ = records_pieces_and_verify_flush_tiles_gdn.patch, sys/): both packs together exceed what one call
# carries. Three calls, each well under 10 minutes:
#   bash experiments/bench/decode_2026-12-04/session12/device_call.sh ab      # tests, then the A/B bench
#   bash experiments/bench/decode_2026-12-04/session12/device_call.sh verify  # lib_verify: tests, A/B against lib_all
#   bash experiments/bench/decode_2026-12-04/session12/device_call.sh ncu     # Nsight source counters, memcheck
#   bash experiments/bench/decode_2026-12-04/session12/device_call.sh targets # Nsight on the kernels behind the missed targets
#   bash experiments/bench/decode_2026-12-04/session12/device_call.sh conv    # the conventional row split: tests, memcheck, A/B
# `targets` (added in session 13) profiles the library TARGET_LIB (default lib_base, main's kernels; lib_all once it has
# landed) and needs no test first: the kernels are the tested ones. Summary: python3 ncu_targets.py <results>/ncu_t_*.csv
# It also times ours and vLLM's ReplaySSM kernel at B = 64 and 128 (carry .device/peers_vllm.tar.xz too).
# `ab` tests lib_all and benches it against lib_base; if lib_all fails its tests, it tests and benches
# lib_records (the non-flush part alone) instead.
set -u
MODE=${1:-ab}
R=$OUT/r; mkdir -p $R
PACK=.device/pack12.tar.xz; [ "$MODE" = verify ] && PACK=.device/pack12v.tar.xz; [ "$MODE" = conv ] && PACK=.device/pack14c.tar.xz
mkdir -p .device/a && tar -C .device/a -xJf $PACK
A=$PWD/.device/a; B=$A/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
SYS=""; if LD_LIBRARY_PATH=$A/lib_all ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
NEW=$A/lib_all$SYS; OLD=$A/lib_base$SYS
# `conv` (session 13, ../../decode_2026-12-05/): pack14c's lib_conv (conventional_row_split.patch on main) against lib_main
# (main at c671731, whose kernels are 7d89d8f's), with that patch's own test binaries and bench (session 14 rebuilt
# pack13c as pack14c: the bench's options struct gained a field, so binary and libraries must come from one commit).
[ "$MODE" = conv ] && { SYS=""; LD_LIBRARY_PATH=$A/lib_conv ldd $B/replayssm-bench | grep -q "not found" && SYS=":$A/sys"; NEW=$A/lib_conv$SYS; OLD=$A/lib_main$SYS; }
SHAPES="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b"
LD_LIBRARY_PATH=$NEW $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
# test_with LIB NAME: test_decode_cuda with library LIB into test_NAME.txt; success status, failures shown.
test_with() {
  local t0=$SECONDS; LD_LIBRARY_PATH=$1 timeout 200 $B/test_decode_cuda > $R/test_$2.txt 2>&1
  echo "test $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/test_$2.txt && return 0
  grep -B5 -A25 "ERROR" $R/test_$2.txt | head -60; return 1
}
# ab_rounds NEW OLD TAG BENCH-ARGS...: 2 rounds of the bench, NEW and OLD alternating, into TAG_{new,old}_ROUND.
ab_rounds() {
  local new=$1 old=$2 tag=$3; shift 3
  for round in $(seq 1 ${ROUNDS:-2}); do
    for lib in new old; do
      local L=$new; [ $lib = old ] && L=$old
      local t1=$SECONDS; LD_LIBRARY_PATH=$L timeout 150 $B/replayssm-bench bench "$@" --csv $R/${tag}_${lib}_$round.csv \
        > $R/${tag}_${lib}_$round.txt 2>&1
      echo "$tag $lib $round rc=$? $((SECONDS-t1))s"
    done
  done
}
if [ "$MODE" = ab ]; then
  # main's own library (7d89d8f): its new launcher-refusal checks first (seconds)
  LD_LIBRARY_PATH=$OLD timeout 60 $B/test_decode_cuda -tc="*launchers refuse*" > $R/test_refusals_base.txt 2>&1
  echo "refusals lib_base rc=$? $(tail -n 3 $R/test_refusals_base.txt | head -n 2 | tr '\n' ' ')"
  # lib_all (patches 1 + 2), or lib_records (patch 1) if lib_all fails its tests
  if test_with $NEW all || { NEW=$A/lib_records$SYS; test_with $NEW records; }; then
    echo "benching $NEW"
    ab_rounds $NEW $OLD main --shapes $SHAPES --batch 32 256 --window 16 --drafts 8
    # Added in session 13: with lib_all benched, one round of lib_records (the non-flush part alone) against
    # lib_base tells the two parts apart in the same call (`parts_{new,old}_1`).
    if [ "$NEW" = "$A/lib_all$SYS" ] && [ $SECONDS -lt 330 ]; then
      ROUNDS=1 ab_rounds $A/lib_records$SYS $OLD parts --shapes $SHAPES --batch 32 256 --window 16 --drafts 8
    fi
  fi
elif [ "$MODE" = verify ]; then
  # lib_verify_gdn (Mamba-2 and GDN flush tiles), or lib_verify (Mamba-2 only) if it fails its tests; against lib_all
  V=$A/lib_verify_gdn$SYS; SH="nemotron-3-super nemotron-3-nano-4b qwen3.5-4b qwen3.5-122b-a10b"
  if test_with $V verify_gdn || { V=$A/lib_verify$SYS; SH="nemotron-3-super nemotron-3-nano-4b"; test_with $V verify; }; then
    echo "benching $V on $SH"
    ab_rounds $V $NEW verify --shapes $SH --batch 32 256 --window 16 --drafts 4 8
    t1=$SECONDS; LD_LIBRARY_PATH=$V timeout 150 compute-sanitizer --tool memcheck $B/test_decode_cuda \
      -tc="*verification kernels*,*after verification commits*,*CUDA Graphs*" > $R/memcheck_verify.txt 2>&1
    echo "memcheck verify rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck_verify.txt
  fi
elif [ "$MODE" = conv ]; then
  # The conventional kernels' row split: its tests (the conventional cases of both suites, which now include dv = 192),
  # memcheck on them, then 2 A/B rounds against main on the shapes it changes (Qwen3.5, Kimi: dv = 128 split in two)
  # and the two it leaves at one block per head (Super dv = 64, Nano dv = 80) as controls. Every other row runs
  # the same kernels in both libraries: an A/A measure of the noise in the same run.
  # First, the bench's own CLI on this GPU with main's library (pack14c is built at c671731): the option and
  # --csv refusals, and a short forced run whose CSV Python's csv module must read as rows of 10 fields.
  t1=$SECONDS; REPLAYSSM_BIN=$B/replayssm-bench LD_LIBRARY_PATH=$OLD timeout 120 python3 -m pytest -q -p no:cacheprovider \
    tests/python/test_cli_bench.py tests/python/test_bench_outputs.py > $R/test_cli_bench.txt 2>&1
  echo "test_cli_bench rc=$? $((SECONDS-t1))s $(tail -n 1 $R/test_cli_bench.txt)"
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 $B/test_decode_kda_cuda -tc="*conventional*" > $R/test_kda_conv.txt 2>&1
  echo "test_decode_kda_cuda conventional rc=$? $((SECONDS-t1))s $(tail -n 3 $R/test_kda_conv.txt | head -n 2 | tr '\n' ' ')"
  kda_ok=0; grep -q "Status: SUCCESS" $R/test_kda_conv.txt && kda_ok=1
  if test_with "$NEW" conv && [ $kda_ok = 1 ]; then
    t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 120 compute-sanitizer --tool memcheck $B/test_decode_cuda -tc="*conventional*" \
      > $R/memcheck_conv.txt 2>&1
    echo "memcheck conventional rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck_conv.txt
    ab_rounds $NEW $OLD conv --shapes qwen3.5-4b qwen3.5-122b-a10b kimi-linear-48b-a3b nemotron-3-super nemotron-3-nano-4b \
      --batch 32 256 --window 16 --drafts 8
  else
    grep -B5 -A25 "ERROR" $R/test_kda_conv.txt | head -40
  fi
elif [ "$MODE" = targets ]; then
  # Nsight Compute on the kernels behind the targets still missed (docs/BENCHMARKS.md, "Where issue 13's targets
  # stand"), with the sections that say where the time goes (no source counters: minutes, not tens of minutes):
  # conventional at B = 32 and 256 (GDN: Qwen3.5-4B at 88.9% of copy; Mamba-2: Super at 92.8%, for contrast), GDN's
  # flush step at B = 256 (1.22 steps), Qwen3.5-4B's staggered step at B = 32 (1.24x), GDN verification without a
  # flush at B = 32 (1.12 steps). The bench runs with --repeats 1 --no-check, so each row's kernel launches come in a
  # known order: the staggered row runs 6 windows of 16 steps, every other row 4 launches (3 warm-ups + 1).
  T=$A/${TARGET_LIB:-lib_base}$SYS
  LD_LIBRARY_PATH=$T $B/replayssm-bench --version > $R/version_targets.txt 2>&1
  # First, the "B >= 32" part of the target over vLLM's ReplaySSM kernel at the two batches never measured
  # against it (B = 64, 128): ours and vLLM 0.33.0's in the same call (.device/peers_vllm.tar.xz: the vllm
  # extract of scripts/fetch_peers.sh, 53 KB).
  if [ -f .device/peers_vllm.tar.xz ] && tar -C . -xJf .device/peers_vllm.tar.xz; then
    t1=$SECONDS; LD_LIBRARY_PATH=$T timeout 150 $B/replayssm-bench bench --shapes nemotron-3-super nemotron-3-nano-4b \
      --batch 64 128 --window 16 --drafts 8 --csv $R/mid_ours.csv > $R/mid_ours.txt 2>&1
    echo "ours B=64,128 rc=$? $((SECONDS-t1))s"
    t1=$SECONDS; timeout 150 python3 scripts/bench_peers.py --peers vllm --shapes nemotron-3-super nemotron-3-nano-4b \
      --batch 64 128 --window 16 --csv $R/mid_vllm.csv > $R/mid_vllm.log 2>&1
    echo "vllm B=64,128 rc=$? $((SECONDS-t1))s"; tail -n 6 $R/mid_vllm.log
  fi
  SEC="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
  # ncu_t NAME REGEX SKIP COUNT BENCH-ARGS...: launches SKIP+1 .. SKIP+COUNT of the kernels matching REGEX
  ncu_t() {
    local name=$1 k=$2 skip=$3 count=$4; shift 4
    if [ $SECONDS -gt 500 ]; then echo "ncu $name skipped (time)"; return; fi
    local t1=$SECONDS metrics=$STALLS rc
    for attempt in 1 2; do  # without the stall metrics if this ncu does not know one of them
      LD_LIBRARY_PATH=$T timeout -s INT 90 ncu --clock-control none --kernel-name-base demangled -k "regex:$k" -s $skip -c $count \
        $SEC ${metrics:+--metrics $metrics} --csv --page details --log-file $R/ncu_t_$name.csv \
        $B/replayssm-bench bench --window 16 --repeats 1 --no-check --arena-gib 16 "$@" > $R/ncu_t_bench_$name.txt 2>&1
      rc=$?
      if [ $rc = 0 ] || grep -q '^"0"' $R/ncu_t_$name.csv 2>/dev/null || [ -z "$metrics" ]; then break; fi
      echo "ncu $name rc=$rc without launches: again without --metrics"; metrics=""
    done
    echo "ncu $name rc=$rc $((SECONDS-t1))s lines=$(wc -l < $R/ncu_t_$name.csv 2>/dev/null)"
  }
  # Warp stall reasons (cycles per issued instruction; the metrics ncu's own CPIStall rules read)
  STALLS=""
  for w in long_scoreboard short_scoreboard wait barrier mio_throttle lg_throttle math_pipe_throttle not_selected \
           no_instruction dispatch_stall membar drain branch_resolving selected; do
    STALLS="$STALLS${STALLS:+,}smsp__average_warps_issue_stalled_${w}_per_issue_active.ratio"
  done
  I128='(.int.)?128'; F0='(.bool.0|false)'; T1='(.bool.1|true)'
  ncu_t conv_gdn "conventional_kernel<.*Recurrence.1, .*StorageFormat.0, " 0 8 --shapes qwen3.5-4b --batch 32 256
  ncu_t conv_m2 "conventional_kernel<.*Recurrence.0, .*StorageFormat.0, " 0 8 --shapes nemotron-3-super --batch 32 256
  # the streamed flush: 96 launches in the staggered row, 4 (empty) in the non-flush row, then the flush step's 4
  ncu_t flush_gdn "replay_flush_kernel<.*Recurrence.1, .*StorageFormat.0, $I128, $F0, $T1>" 96 8 --shapes qwen3.5-4b --batch 256
  # the staggered row's first 16 steps: flush kernel, then non-flush kernel, per step
  ncu_t step_b32 "replay_(non)?flush_kernel<.*Recurrence.1, .*StorageFormat.0, " 0 32 --shapes qwen3.5-4b --batch 32
  ncu_t verify_b32 "verify_kernel<.*Recurrence.1, $I128, (.int.)?8[,>]" 0 2 --shapes qwen3.5-4b --batch 32 --drafts 8
else
  # NVFP4 (6) and FP16 (1) reads, Mamba-2 dk 128, Super shape, B 256, h0 = L/2: the tensor-core instance for NVFP4
  for lib in new old; do
    L=$NEW; [ $lib = old ] && L=$OLD
    for f in 6 1; do
      last=0; [ $f = 6 ] && last=1
      K="regex:replay_nonflush_kernel<.*StorageFormat\)$f, \(int\)128, \(bool\)0, \(bool\)$last>"
      t1=$SECONDS
      LD_LIBRARY_PATH=$L timeout 120 ncu --kernel-name-base demangled --kernel-name "$K" --launch-count 1 --section SourceCounters \
        --section WarpStateStats --section InstructionStats --section SpeedOfLight --section Occupancy --import-source yes \
        -o $R/src_${lib}_$f $B/replayssm-bench bench --shapes nemotron-3-super --batch 256 --window 16 --arena-gib 20 \
        --repeats 1 --no-check > $R/ncu_log_${lib}_$f.txt 2>&1
      echo "ncu $lib $f rc=$? $((SECONDS-t1))s"
      ncu -i $R/src_${lib}_$f.ncu-rep --page source --csv --print-source cuda,sass > $R/src_page_${lib}_$f.csv 2>&1
      ncu -i $R/src_${lib}_$f.ncu-rep --page details > $R/details_${lib}_$f.txt 2>&1
      rm -f $R/src_${lib}_$f.ncu-rep
    done
  done
  t1=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 200 compute-sanitizer --tool memcheck $B/test_decode_cuda \
    -tc="*staggered windows*,*appendix F skipping*,*after verification commits*,*exactly representable*" > $R/memcheck.txt 2>&1
  echo "memcheck rc=$? $((SECONDS-t1))s"; tail -n 2 $R/memcheck.txt
fi
sed -i "s#$PWD#<repository>#g" $R/*.txt $R/*.csv $R/*.log 2>/dev/null
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
