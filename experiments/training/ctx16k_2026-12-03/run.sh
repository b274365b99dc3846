#!/usr/bin/env bash
# Session 2026-12-03 (5), issue 11: the Qwen3.5-style GDN hybrid trained with long contexts from the start,
# two schedules at once on one GPU, with the memory trace measured on text (log[].memory_text):
#   A: 2 x 16384 bytes from step 0;  B: 8 x 4096 bytes, then 2 x 16384 from 25% of the steps.
# Same initialisation, optimiser and tokens per step as the bundled long_qwen3_5 (its card).
# (Run as .device/train_call4.sh.) Carry: .device/train_call4.sh .device/gutenberg.tar.xz .device/pg19
set -u
WORK=${WORK:-$(mktemp -d)}   # scratch: the unpacked training text and the runs
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=6
mkdir -p $WORK/gut && tar -C $WORK/gut -xJf .device/gutenberg.tar.xz
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
G=$WORK/gut/gutenberg-train; P=.device/pg19
common="--arch qwen3_5 --train-dir $G --pg19-dir $P --device cuda --steps 30000 --tokens-per-step 32768 --decay-init log-uniform --gdn-scan associative --gdn-chunk 128 --log-every 25 --minutes 7.9 --decay-length 0 --replayssm NONE"
mkdir -p $OUT/logs
python3 scripts/train_tiny.py --out $WORK/tr/gdn_long_a $common --seq-len-schedule 16384:0 > $OUT/logs/gdn_long_a.log 2>&1 &
python3 scripts/train_tiny.py --out $WORK/tr/gdn_long_b $common --seq-len-schedule 4096:0,16384:0.25 > $OUT/logs/gdn_long_b.log 2>&1 &
pids=$(jobs -p)
( while sleep 60; do nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader; for f in $OUT/logs/*.log; do echo "$f: $(grep -a 'step' $f | tail -1 | cut -c1-150)"; done; done ) &
mon=$!
for j in $pids; do wait $j; echo "job $j exit $?"; done
kill $mon
for m in gdn_long_a gdn_long_b; do
  mkdir -p $OUT/runs/$m; cp $WORK/tr/$m/train_log.json $WORK/tr/$m/MODEL_CARD.md $WORK/tr/$m/config.json $OUT/runs/$m/ 2>/dev/null
  [[ -f $WORK/tr/$m/model.safetensors ]] && split -b 15M -d $WORK/tr/$m/model.safetensors $OUT/${m}.safetensors.part
  sha256sum $WORK/tr/$m/model.safetensors >> $OUT/runs/sha256.txt
done
tar -C $OUT -czf $OUT/train_runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
ls -la $OUT
