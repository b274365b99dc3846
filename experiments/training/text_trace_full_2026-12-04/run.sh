#!/usr/bin/env bash
# Session 2026-12-04, issue 11: one bundled recipe ALONE at its bundled step count (its card's budget-free command),
# with the memory trace measured on text every 25 steps, so the settling evidence is of the bundled recipe at
# full length. Usage: bash .device/train_alone.sh long_mamba2|long_nemotron_h|long_kimi_linear
# Ran on one H200, one call each: 261 s, 483 s and 153 s of training (long_nemotron_h, long_kimi_linear, long_mamba2);
# long_nemotron_h shared its call with the decode tests (issue 13) for part of it: the step count is fixed
# (--minutes 0), so that changed only its wall time.
# Carry: this script, .device/gutenberg.tar.xz (a copy of ../shared/data/gutenberg-train) and .device/pg19 (a copy of ../shared/data/pg19/test).
set -u
m=$1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
WORK=$(mktemp -d); mkdir -p $WORK/gut && tar -C $WORK/gut -xJf .device/gutenberg.tar.xz
G=$WORK/gut/gutenberg-train; P=.device/pg19
common="--train-dir $G --pg19-dir $P --device cuda --tokens-per-step 32768 --decay-init log-uniform --log-every 25 --minutes 0 --decay-length 0 --replayssm NONE"
case $m in
  long_mamba2) a="--arch mamba2 --steps 2280 --seq-len-schedule 1024:0.0,4096:0.2894736842105263,16384:0.6131578947368421";;
  long_nemotron_h) a="--arch nemotron_h --eval-chunk 2048 --eval-batch 1 --steps 3538 --seq-len-schedule 1024:0.0,4096:0.31345392877331824,16384:0.6308648954211419";;
  long_kimi_linear) a="--arch kimi_linear --gdn-scan associative --gdn-chunk 64 --steps 2511 --seq-len-schedule 1024:0.0,4096:0.32218239745121463,16384:0.6133014735165273";;
  *) echo "unknown $m"; exit 2;;
esac
mkdir -p $OUT/logs $OUT/runs/$m
timeout 560 python3 scripts/train_tiny.py --out $WORK/tr/$m $common $a > $OUT/logs/$m.log 2>&1; echo "exit $?"
cp $WORK/tr/$m/{train_log.json,MODEL_CARD.md,config.json} $OUT/runs/$m/ 2>/dev/null
tar -C $OUT -czf $OUT/train_runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs; tail -3 $OUT/../*.log 2>/dev/null; ls -la $OUT
