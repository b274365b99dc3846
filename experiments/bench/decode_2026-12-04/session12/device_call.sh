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
# `ab` tests lib_all and benches it against lib_base; if lib_all fails its tests, it tests and benches
# lib_records (the non-flush part alone) instead.
set -u
MODE=${1:-ab}
R=$OUT/r; mkdir -p $R
PACK=.device/pack12.tar.xz; [ "$MODE" = verify ] && PACK=.device/pack12v.tar.xz
mkdir -p .device/a && tar -C .device/a -xJf $PACK
A=$PWD/.device/a; B=$A/bin
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
SYS=""; if LD_LIBRARY_PATH=$A/lib_all ldd $B/replayssm-bench | grep -q "not found"; then SYS=":$A/sys"; fi
NEW=$A/lib_all$SYS; OLD=$A/lib_base$SYS
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
  for round in 1 2; do
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
sed -i "s#$PWD#<repository>#g" $R/*.txt $R/*.csv 2>/dev/null
xz -9 -T8 $R/*.txt $R/*.csv; tar -C $OUT -cf $OUT/results.tar r && rm -rf $R; ls -la $OUT
