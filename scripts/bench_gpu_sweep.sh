#!/usr/bin/env bash
# The GPU sweep benchmark of issue 10 on 4B-class shapes: random BF16 checkpoints with the shapes of
# Qwen3.5-4B and Nemotron-3-Nano-4B (scripts/make_random_checkpoint.py), then per model
#   1. `replayssm kl-sweep --device cuda` on one PG-19 book at --length N (default 131072): the
#      reference + the configurations asked for, REPLAYSSM_GPU_TIMING=1 (the per-pass time split:
#      GEMMs, attention, scans, KL, TFLOP/s), the result file and the log kept in OUT_DIR;
#   2. transformers' FP32 forward of the same checkpoint (sdpa attention, TF32 off, LM head and
#      log-softmax in chunks), at N, halving on out-of-memory, one timed forward after a warm-up.
# Run on the GPU machine from the repository root after the pack is unpacked (scripts/gpu_pack.sh):
#
#   scripts/bench_gpu_sweep.sh TEXT_DIR OUT_DIR [--models qwen3.5-4b,nemotron-3-nano-4b] [--length N]
#       [--configs K | --policies P1,P2] [--compute fp32|bf16x3|bf16] [--skip-sweep] [--skip-transformers]
#       [--tf-length N] [--ckpt-dir DIR] [--deadline SECONDS] [--replayssm BIN] [--device cuda|cpu]
#       [--tiny] [--layers K]
#
#   --configs K     the first K of the paper's configurations in the order below (a timing sample; the
#                   time of a pass hardly depends on the policy); default: the whole default set of
#                   `replayssm kl-sweep` (src/eval/policy_set.cpp default_policy_specs)
#   --deadline S    the whole run stops after S seconds (default 570, inside a 10-minute command): each
#                   stage runs under `timeout` with what is left; a sweep cut short keeps its finished
#                   cells (run the same command again to resume), a skipped stage is said so
#   --tiny, --layers K, --device cpu   testing on a machine without a GPU (tiny shapes, CPU engine)
#
# Output: OUT_DIR/<shape>.h5 (or <shape>_K<k>.h5), <shape>_sweep.log (with the timing lines),
# <shape>_transformers.json and .log, checkpoint.log; a summary of every pass's time at the end.
# Checkpoints go to --ckpt-dir (default /tmp/replayssm_bench) and are reused when already complete.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo=$PWD

usage() { sed -n '2,29p' "$0"; exit 2; }
[[ $# -ge 2 ]] || usage
text_dir=$1 out_dir=$2
shift 2
models=qwen3.5-4b,nemotron-3-nano-4b length=131072 configs="" policies="" compute=fp32 skip_sweep=0 skip_tf=0
tf_length="" ckpt_dir=/tmp/replayssm_bench deadline=570 device=cuda tiny=0 layers="" bin=""
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
[[ -z $layers ]] || is_count "$layers" || { echo "--layers '$layers': expected a positive integer" >&2; exit 2; }
[[ -n $configs && -n $policies ]] && { echo "--configs and --policies: give one of them" >&2; exit 2; }
[[ -d $text_dir ]] || { echo "TEXT_DIR '$text_dir' is not a folder of .txt books" >&2; exit 2; }
tf_length=${tf_length:-$length}

# The paper's configurations (src/eval/policy_set.cpp default_policy_specs), the two most used by
# the paper first, so that --configs 1 or 2 samples a shared and a split pass.
paper_set=(shared:nvfp4+sr split:nvfp4+rtn/fp16+sr shared:fp16+sr shared:fp8b128+sr shared:fp16+rtn shared:fp8b128+rtn
           shared:nvfp4+rtn split:nvfp4+rtn/fp32 split:nvfp4+rtn/fp8b128+sr)
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

  if (( ! skip_sweep )); then
    res=$out_dir/$tag${configs:+_K$configs}.h5
    log=$out_dir/${tag}_sweep.log
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

  if (( ! skip_tf )); then
    tj=$out_dir/${tag}_transformers.json
    say "$shape: transformers FP32 forward from $tf_length positions (halving on out-of-memory) -> $tj"
    within_deadline python3 - "$ckpt" "$text_dir" "$tf_length" "$tj" <<'PY' 2>&1 | tee -a "$out_dir/${tag}_transformers.log"
# transformers' fastest FP32 forward of the checkpoint on the same book: sdpa attention, TF32 off;
# the decoder's final hidden states, then LM head + log-softmax in chunks of 4096 positions (the full
# N x vocab logits would not fit). One warm-up forward on 1024 positions, then one timed forward at
# N; out of memory: N halved, down to 1024 (or N when shorter).
import gc, json, pathlib, sys, time
import torch, transformers
ckpt, text_dir, n_first, out = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3]), pathlib.Path(sys.argv[4])
dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
torch.set_grad_enabled(False)
book = sorted(text_dir.glob("*.txt"))[0]
# Byte-level ids of the same book's raw bytes (the sweep strips the Gutenberg header first: for a
# timing the content does not matter).
ids_all = torch.tensor(list(book.read_bytes()[:n_first]), dtype=torch.long)
t0 = time.time()
model = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="sdpa").to(dev).eval()
load_s = time.time() - t0
head = model.get_output_embeddings()
print(f"transformers {transformers.__version__}, torch {torch.__version__}: {type(model).__name__} loaded in "
      f"{load_s:.1f} s on {dev} ({torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'})", flush=True)

def sync():
    if dev == "cuda":
        torch.cuda.synchronize()

def forward(n):
    ids = ids_all[:n].to(dev)[None]
    sync(); t = time.time()
    h = model.model(input_ids=ids, use_cache=False).last_hidden_state[0]
    sync(); t_body = time.time() - t
    lse = torch.empty(n, dtype=torch.float64, device=dev)
    for r in range(0, n, 4096):
        lse[r:r + 4096] = torch.log_softmax(head(h[r:r + 4096]), dim=-1)[:, 0].double()
    sync()
    return t_body, time.time() - t, bool(torch.isfinite(lse).all())

result = {"model_dir": ckpt, "book": book.name, "model_class": type(model).__name__, "device": dev,
          "transformers_version": transformers.__version__, "torch_version": torch.__version__,
          "attn_implementation": "sdpa", "tf32": False, "load_seconds": round(load_s, 1), "attempts": []}
floor = min(1024, n_first)
forward(floor)  # warm-up (cuBLAS handles, kernel selection)
n = n_first
while n >= floor:
    print(f"transformers FP32 forward: trying {n} positions", flush=True)
    try:
        body, total, finite = forward(n)
    except torch.OutOfMemoryError:
        body = None
    if body is None:  # outside the except block: the failed forward's tensors are released by now
        result["attempts"].append({"n_positions": n, "outcome": "out of memory"})
        out.write_text(json.dumps(result, indent=2) + "\n")  # partial results kept
        print(f"transformers FP32 forward: {n} positions: out of memory; halving", flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        n //= 2
        continue
    result.update(n_positions=n, body_seconds=round(body, 3), total_seconds=round(total, 3),
                  tokens_per_second=round(n / total, 1), finite=finite)
    if dev == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"transformers FP32 forward: {n} positions in {total:.2f} s ({n / total:.0f} tokens/s; decoder "
          f"{body:.2f} s, LM head + log-softmax {total - body:.2f} s), finite {finite}", flush=True)
    break
if "n_positions" not in result:
    print(f"transformers FP32 forward: out of memory down to {floor} positions", flush=True)
PY
    rc=${PIPESTATUS[0]}
    say "$shape: transformers step exit $rc"
    [[ -f $tj ]] && summary+=("$shape: transformers $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{r.get('n_positions','-')} positions in {r.get('total_seconds','-')} s ({r.get('tokens_per_second','-')} tokens/s)\")" "$tj")")
  fi
done

say "summary (per pass: wall time and tokens/s; full lines in the *_sweep.log files):"
for s in "${summary[@]}"; do echo "  $s"; done
