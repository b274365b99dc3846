#!/usr/bin/env bash
# Session 2026-12-03 (6), issue 11: the recipes of long_mamba2, long_nemotron_h and long_kimi_linear (their
# cards' commands) trained again, all three at once on one H200 under a 6.2-minute guard, to record the
# memory trace measured on text (log[].memory_text), which their bundled trainings predate. Sharing the GPU
# fits shorter schedules (77%, 50% and 25% of the bundled steps); the weights were not kept.
# (Run as .device/train_call3.sh, with /tmp in place of $WORK.) Carry: the script, .device/gutenberg.tar.xz
# (a copy of ../shared/data/gutenberg-train) and .device/pg19 (a copy of ../shared/data/pg19/test).
set -u
WORK=${WORK:-$(mktemp -d)}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
mkdir -p $WORK/gut && tar -C $WORK/gut -xJf .device/gutenberg.tar.xz
G=$WORK/gut/gutenberg-train; P=.device/pg19
common="--train-dir $G --pg19-dir $P --device cuda --tokens-per-step 32768 --decay-init log-uniform --log-every 25 --minutes 6.2 --decay-length 0 --replayssm NONE"
mkdir -p $OUT/logs
python3 scripts/train_tiny.py --arch mamba2 --out $WORK/tr/long_mamba2 $common --steps 2280 --seq-len-schedule 1024:0.0,4096:0.2894736842105263,16384:0.6131578947368421 > $OUT/logs/mamba2.log 2>&1 &
python3 scripts/train_tiny.py --arch nemotron_h --out $WORK/tr/long_nemotron_h $common --eval-chunk 2048 --eval-batch 1 --steps 3538 --seq-len-schedule 1024:0.0,4096:0.31345392877331824,16384:0.6308648954211419 > $OUT/logs/nemotron_h.log 2>&1 &
python3 scripts/train_tiny.py --arch kimi_linear --out $WORK/tr/long_kimi_linear $common --gdn-scan associative --gdn-chunk 64 --steps 2511 --seq-len-schedule 1024:0.0,4096:0.32218239745121463,16384:0.6133014735165273 > $OUT/logs/kimi_linear.log 2>&1 &
pids=$(jobs -p)
( while sleep 60; do for f in $OUT/logs/*.log; do echo "$f: $(grep -a 'step' $f | tail -1 | cut -c1-150)"; done; done ) &
mon=$!
for j in $pids; do wait $j; echo "job $j exit $?"; done
kill $mon
for m in long_mamba2 long_nemotron_h long_kimi_linear; do
  mkdir -p $OUT/runs/$m; cp $WORK/tr/$m/train_log.json $WORK/tr/$m/MODEL_CARD.md $WORK/tr/$m/config.json $OUT/runs/$m/ 2>/dev/null
done
tar -C $OUT -czf $OUT/train_runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
