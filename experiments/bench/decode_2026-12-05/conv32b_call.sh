#!/usr/bin/env bash
# Session 14: the conventional row split for FP32 states only, its FP16/BF16 instances compiled to main's
# code (SASS-identical to main's, 36 of 36; the Mamba-2/GDN FP32 instances identical to call 6's tested
# lib_conv32). Pack .device/pack14g.tar.xz: bin/ (its test binaries and bench), lib_head/ (main), lib_conv32b/, sys/.
source "$(dirname "$0")/device_common.sh"
unpack_pack .device/pack14g.tar.xz lib_head
HEAD=$A/lib_head$SYS; NEW=$A/lib_conv32b$SYS
LD_LIBRARY_PATH=$NEW $B/replayssm-bench --version > $R/version.txt 2>&1; cat $R/version.txt
ok=1
for s in "test_decode_cuda conv" "test_decode_kda_cuda conv_kda"; do set -- $s; t0=$SECONDS
  LD_LIBRARY_PATH=$NEW timeout 150 $B/$1 -tc="*conventional*" > $R/test_$2.txt 2>&1
  echo "test $2 rc=$? $((SECONDS-t0))s $(tail -n 3 $R/test_$2.txt | head -n 2 | tr '\n' ' ')"
  grep -q "Status: SUCCESS" $R/test_$2.txt || ok=0
  t0=$SECONDS; LD_LIBRARY_PATH=$NEW timeout 150 compute-sanitizer --tool memcheck $B/$1 -tc="*conventional*" > $R/memcheck_$2.txt 2>&1
  echo "memcheck $2 rc=$? $((SECONDS-t0))s $(tail -n 1 $R/memcheck_$2.txt)"
done
if [ $ok = 1 ]; then
  for round in 1 2; do
    for lib in new old; do L=$NEW; [ $lib = old ] && L=$HEAD; t0=$SECONDS
      # Kimi (KDA's split, the part not yet measured) and Super (unsplit) as the control; little device time was left.
      LD_LIBRARY_PATH=$L timeout 150 $B/replayssm-bench bench --shapes kimi-linear-48b-a3b nemotron-3-super \
        --batch 32 256 --window 16 --drafts 8 --csv $R/main_${lib}_$round.csv > $R/main_${lib}_$round.txt 2>&1
      echo "bench $lib $round rc=$? $((SECONDS-t0))s"
    done
  done
fi
pack_results
