#!/usr/bin/env bash
# The GPU sweep benchmark of issue 10 on 4B-class shapes: random BF16 checkpoints with the shapes of
# Qwen3.5-4B and Nemotron-3-Nano-4B (scripts/make_random_checkpoint.py), then per model
#   1. scripts/bench_transformers.py: `replayssm logits --device cuda` validated against transformers'
#      FP32 log-probs on the first --validate positions (at --compute fp32 and the sweep's compute),
#      before anything is timed; then transformers' FP32 forward (sdpa attention, TF32 off, LM head
#      and log-softmax in chunks) at --tf-length, halving on out-of-memory, timed after a warm-up;
#   2. our forward at the length transformers reached (one sweep cell per compute precision, timed);
#   3. `replayssm kl-sweep --device cuda` on one PG-19 book at --length N (default 131072): the
#      reference + the configurations asked for, REPLAYSSM_GPU_TIMING=1 (the per-pass time split:
#      GEMMs, attention, scans, KL, TFLOP/s), the result file and the log kept in OUT_DIR.
# Run on the GPU machine from the repository root after the pack is unpacked (scripts/gpu_pack.sh):
#
#   scripts/bench_gpu_sweep.sh TEXT_DIR OUT_DIR [--models qwen3.5-4b,nemotron-3-nano-4b] [--length N]
#       [--configs K | --policies P1,P2] [--compute fp32|bf16x3|bf16] [--skip-sweep] [--skip-transformers]
#       [--tf-length N] [--ckpt-dir DIR] [--deadline SECONDS] [--replayssm BIN] [--device cuda|cpu]
#       [--validate N] [--tiny] [--layers K]
#
#   --configs K     the first K of the paper's ten configurations in the order below (a timing sample:
#                   the time of a pass hardly depends on the policy); default: all ten
#   --deadline S    the whole run stops after S seconds (default 570, inside a 10-minute command): each
#                   stage runs under `timeout` with what is left; a sweep cut short keeps its finished
#                   cells (run the same command again to resume), a skipped stage is said so
#   --validate N    positions of the validation against transformers (default 512; 0: none)
#   --tiny, --layers K, --device cpu   testing on a machine without a GPU (tiny shapes, CPU engine)
#
# Output: OUT_DIR/<shape>_K<k>[_<compute>].h5, <shape>_sweep[_<compute>].log (with the timing lines),
# <shape>_transformers.json and .log (validation and timing), <shape>_at<n>_<compute>.log, checkpoint.log; a summary of every pass's time at the end.
# Checkpoints go to --ckpt-dir (default build/bench-checkpoints, ignored by git) and are reused when already complete.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$PWD

usage() { sed -n '2,30p' "$0"; exit 2; }
[[ $# -ge 2 ]] || usage
text_dir=$1 out_dir=$2
shift 2
models=qwen3.5-4b,nemotron-3-nano-4b length=131072 configs="" policies="" compute=fp32 skip_sweep=0 skip_tf=0
tf_length="" validate=512 ckpt_dir=build/bench-checkpoints deadline=570 device=cuda tiny=0 layers="" bin=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --models) models=$2; shift 2 ;;
    --length) length=$2; shift 2 ;;
    --configs) configs=$2; shift 2 ;;
    --policies) policies=$2; shift 2 ;;
    --compute) compute=$2; shift 2 ;;
    --skip-sweep) skip_sweep=1; shift ;;
    --skip-transformers) skip_tf=1; shift ;;
    --tf-length) tf_length=$2; shift 2 ;;
    --validate) validate=$2; shift 2 ;;
    --ckpt-dir) ckpt_dir=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    --replayssm) bin=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --tiny) tiny=1; shift ;;
    --layers) layers=$2; shift 2 ;;
    -h|--help) usage ;;
    *) echo "bench_gpu_sweep.sh: unknown option '$1'" >&2; usage ;;
  esac
done
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
is_count "$length" || { echo "--length '$length': expected a positive integer" >&2; exit 2; }
is_count "$deadline" || { echo "--deadline '$deadline': expected a positive number of seconds" >&2; exit 2; }
[[ -z $configs ]] || is_count "$configs" || { echo "--configs '$configs': expected a positive integer" >&2; exit 2; }
[[ -z $tf_length ]] || is_count "$tf_length" || { echo "--tf-length '$tf_length': expected a positive integer" >&2; exit 2; }
[[ $validate =~ ^[0-9]+$ ]] || { echo "--validate '$validate': expected a number of positions (0: none)" >&2; exit 2; }
[[ -z $layers ]] || is_count "$layers" || { echo "--layers '$layers': expected a positive integer" >&2; exit 2; }
[[ -n $configs && -n $policies ]] && { echo "--configs and --policies: give one of them" >&2; exit 2; }
[[ -d $text_dir ]] || { echo "TEXT_DIR '$text_dir' is not a folder of .txt books" >&2; exit 2; }
tf_length=${tf_length:-$length}

# The paper's configurations (REPLAYSSM.md section 4; src/eval/policy_set.cpp default_policy_specs,
# nine at L = 16) and, as the issue's tenth, shared NVFP4+SR at L = 64 (the long end of figure 13's
# window sweep); the two most used by the paper first, so that --configs 1 or 2 samples a shared
# and a split pass.
paper_set=(shared:nvfp4+sr split:nvfp4+rtn/fp16+sr shared:fp16+sr shared:fp8b128+sr shared:fp16+rtn shared:fp8b128+rtn
           shared:nvfp4+rtn split:nvfp4+rtn/fp32 split:nvfp4+rtn/fp8b128+sr shared:nvfp4+sr@64)
[[ -z $configs && -z $policies ]] && configs=${#paper_set[@]}
if [[ -n $configs ]]; then
  (( configs <= ${#paper_set[@]} )) || { echo "--configs $configs: the set has ${#paper_set[@]}" >&2; exit 2; }
  policies=$(IFS=,; echo "${paper_set[*]:0:$configs}")
fi

if [[ -z $bin ]]; then
  if [[ -x .device/bin/replayssm ]]; then bin=.device/bin/replayssm; else bin=build/replayssm; fi
fi
[[ -x $bin ]] || { echo "no replayssm binary at '$bin' (unpack the pack, build, or give --replayssm)" >&2; exit 2; }
[[ -d .device/lib ]] && export LD_LIBRARY_PATH=$repo/.device/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export REPLAYSSM_SOURCE_DIR=$repo HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
mkdir -p "$out_dir" "$ckpt_dir"
start=$SECONDS
left() { echo $(( deadline - (SECONDS - start) )); }
say() { printf '[bench %4ds] %s\n' $((SECONDS - start)) "$*"; }
# Runs "$@" under timeout with the time left (minus a 5 s margin); returns its status, 124 on timeout.
within_deadline() {
  local t=$(( $(left) - 5 ))
  if (( t < 10 )); then say "SKIPPED (deadline of ${deadline} s reached): $*"; return 125; fi
  timeout --signal=TERM --kill-after=10 "$t" "$@"
}

declare -a summary
IFS=, read -r -a model_list <<< "$models"
for shape in "${model_list[@]}"; do
  case $shape in qwen3.5-4b|nemotron-3-nano-4b) ;; *) echo "--models: '$shape' is not qwen3.5-4b or nemotron-3-nano-4b" >&2; exit 2 ;; esac
  tag=$shape
  (( tiny )) && tag=${tag}_tiny
  [[ -n $layers ]] && tag=${tag}_L$layers
  ckpt=$ckpt_dir/$tag
  say "$shape: checkpoint -> $ckpt"
  extra=()
  (( tiny )) && extra+=(--tiny)
  [[ -n $layers ]] && extra+=(--layers "$layers")
  if ! within_deadline python3 scripts/make_random_checkpoint.py --shape "$shape" --out "$ckpt" "${extra[@]}" \
       2>&1 | tee -a "$out_dir/checkpoint.log"; then
    say "$shape: checkpoint FAILED (see $out_dir/checkpoint.log)"; summary+=("$shape: no checkpoint"); continue
  fi

  # 1. transformers: our GPU log-probs validated against its FP32 ones (before anything is timed),
  #    then its own forward timed at the longest length it holds.
  tf_n=""
  if (( ! skip_tf )); then
    tj=$out_dir/${tag}_transformers.json
    computes=fp32
    [[ $compute != fp32 ]] && computes=fp32,$compute
    say "$shape: validation against transformers ($validate positions, --compute $computes), then its FP32 forward from $tf_length positions -> $tj"
    within_deadline python3 scripts/bench_transformers.py --ckpt "$ckpt" --text-dir "$text_dir" --length "$tf_length" \
      --out "$tj" --validate-positions "$validate" --computes "$computes" --replayssm "$bin" --device "$device" \
      2>&1 | tee -a "$out_dir/${tag}_transformers.log"
    rc=${PIPESTATUS[0]}
    say "$shape: transformers step exit $rc$( (( rc == 1 )) && echo ' (VALIDATION FAILED: see the log)')"
    if [[ -f $tj ]]; then
      summary+=("$shape: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); v=', '.join(f\"{e['compute']} max |diff| {e.get('max_abs_logprob_diff', '-')}\" for e in r['validation']); print(f\"validation on {r['validation'][0].get('positions', '-') if r['validation'] else '-'} positions: {v or 'none'}; transformers {r.get('n_positions','-')} positions in {r.get('total_seconds','-')} s ({r.get('tokens_per_second','-')} tokens/s)\")" "$tj")")
      tf_n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('n_positions', ''))" "$tj")
    fi
  fi

  # 2. our forward at transformers' length, same run: one sweep cell (reference + one configuration)
  #    per compute precision, with the GPU time split; the result files are scratch.
  if [[ -n $tf_n && $device == cuda ]]; then
    for c in fp32 $([[ $compute != fp32 ]] && echo "$compute"); do
      elog=$out_dir/${tag}_at${tf_n}_${c}.log
      say "$shape: replayssm at transformers' length $tf_n, --compute $c (log $elog)"
      REPLAYSSM_GPU_TIMING=1 within_deadline "$bin" kl-sweep "$ckpt" --text-dir "$text_dir" --books 1 --length "$tf_n" \
        --policies shared:nvfp4+sr@16 --out "$out_dir/scratch_${tag}_${tf_n}_$c.h5" --force --device cuda --compute "$c" \
        --progress off > "$elog" 2>&1
      say "$shape: exit $?"
      while IFS= read -r line; do summary+=("$shape at $tf_n, $c: ${line#kl-sweep: }"); done \
        < <(grep -E '^kl-sweep: GPU timing' "$elog" | sed -E 's/ = GEMMs.*//')
      rm -f "$out_dir/scratch_${tag}_${tf_n}_$c.h5"
    done
  fi

  # 3. the sweep (last: the longest stage; a run cut by the deadline keeps its finished cells).
  if (( ! skip_sweep )); then
    suffix=""
    [[ $compute != fp32 ]] && suffix=_$compute
    res=$out_dir/$tag${configs:+_K$configs}$suffix.h5
    log=$out_dir/${tag}_sweep$suffix.log
    args=(kl-sweep "$ckpt" --text-dir "$text_dir" --books 1 --length "$length" --windows 16 --out "$res"
          --device "$device" --progress lines)
    [[ $device == cuda ]] && args+=(--compute "$compute")
    [[ -n $policies ]] && args+=(--policies "$policies")
    say "$shape: $bin ${args[*]}  (log $log)"
    t0=$SECONDS
    REPLAYSSM_GPU_TIMING=1 within_deadline "$bin" "${args[@]}" > >(tee -a "$log") 2>&1
    rc=$?
    sleep 1  # let tee finish the log
    note=""
    (( rc == 124 )) && note=" (cut by the deadline: the finished cells are kept; the same command resumes)"
    say "$shape: kl-sweep exit $rc after $((SECONDS - t0)) s$note"
    summary+=("$shape: kl-sweep exit $rc, $((SECONDS - t0)) s including the load")
    while IFS= read -r line; do summary+=("$shape: ${line#kl-sweep: }"); done \
      < <(grep -E '^kl-sweep: GPU timing|^results: ' "$log" | sed -E 's/ = GEMMs.*//')
  fi
done

say "summary (per pass: wall time and tokens/s; full lines in the *_sweep.log files):"
for s in "${summary[@]}"; do echo "  $s"; done
