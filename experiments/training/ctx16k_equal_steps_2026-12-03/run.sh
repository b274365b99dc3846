#!/usr/bin/env bash
# Session 2026-12-03 (6), issue 11: long_qwen3_5_ctx16k's recipe (2 x 16384 bytes from the first step)
# trained ALONE at the bundled long_qwen3_5's step count (--steps 3399; the 8.6-minute guard refitted it to
# 3278), with the memory trace measured on text. Bundled as data/models/long_qwen3_5_ctx16k.
# (Run as .device/train_call5.sh, with /tmp in place of $WORK.) Carry: the script, .device/gutenberg.tar.xz
# (a copy of ../shared/data/gutenberg-train) and .device/pg19 (a copy of ../shared/data/pg19/test).
set -u
WORK=${WORK:-$(mktemp -d)}   # scratch: the unpacked training text and the run
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
mkdir -p $WORK/gut && tar -C $WORK/gut -xJf .device/gutenberg.tar.xz
G=$WORK/gut/gutenberg-train; P=.device/pg19
mkdir -p $OUT/logs
timeout 570 python3 scripts/train_tiny.py --arch qwen3_5 --out $WORK/tr/ctx16k_3399 --train-dir $G --pg19-dir $P --device cuda \
  --steps 3399 --minutes 8.6 --tokens-per-step 32768 --decay-init log-uniform --gdn-scan associative --gdn-chunk 128 \
  --log-every 25 --decay-length 0 --replayssm NONE --seq-len-schedule 16384:0 > $OUT/logs/ctx16k_3399.log 2>&1
m=ctx16k_3399; mkdir -p $OUT/runs/$m; cp $WORK/tr/$m/{train_log.json,MODEL_CARD.md,config.json} $OUT/runs/$m/ 2>/dev/null
[[ -f $WORK/tr/$m/model.safetensors ]] && split -b 15M -d $WORK/tr/$m/model.safetensors $OUT/$m.safetensors.part
tar -C $OUT -czf $OUT/train_runs.tgz runs logs && rm -rf $OUT/runs $OUT/logs
# Here, after the call: cat the parts into data/models/long_qwen3_5_ctx16k/model.safetensors, copy the card,
# config and train_log.json beside it, write the device paths as what they stood for, then (CPU, 51 s):
#   python3 scripts/train_tiny.py --add-decays data/models/long_qwen3_5_ctx16k --pg19-dir ../shared/data/pg19/test
