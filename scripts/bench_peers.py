#!/usr/bin/env python3
"""Outside peers of `replayssm bench` that implement this paper upstream, imported from the wheels' files
that scripts/fetch_peers.sh extracts, validated against a float64 evaluation of the recurrence on the same
inputs, then timed (median; --timer, replayssm_py/peer_timing.py):
  vllm        vLLM's Mamba-2 decode kernels (the tuned conventional `selective_state_update` and
              `selective_state_update_replayssm_output_only`); python/replayssm_py/peers_vllm.py.
  flashinfer  FlashInfer's ReplaySSM Mamba-2 kernel `checkpointing_ssu` (monolithic and two-kernel),
              prebuilt for sm_90a by fetch_peers.sh; python/replayssm_py/peers_flashinfer.py.
Run it on the GPU machine in the same call as `replayssm-bench bench` so the ratios come from one run.
"""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py import peers_flashinfer, peers_vllm  # noqa: E402
from replayssm_py.files import output_refusal, write_csv_atomically  # noqa: E402
from replayssm_py.peer_timing import TIMERS  # noqa: E402
from replayssm_py.peers_vllm import MAMBA2_SHAPES, run_vllm_bench  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", choices=("vllm", "flashinfer", "both"), default="vllm", help="which peers to run")
    ap.add_argument("--vllm", default=".peers/vllm-0.33.0", help="extracted vllm files (scripts/fetch_peers.sh)")
    ap.add_argument("--flashinfer", default=f".peers/flashinfer-{peers_flashinfer.VERSION}",
                    help="extracted flashinfer files with the prebuilt module (scripts/fetch_peers.sh)")
    ap.add_argument("--flashinfer-algorithm", nargs="+", choices=peers_flashinfer.ALGORITHMS,
                    default=list(peers_flashinfer.ALGORITHMS), help="checkpointing_ssu code paths to time")
    ap.add_argument("--shapes", nargs="+", default=list(MAMBA2_SHAPES), choices=list(MAMBA2_SHAPES))
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--timer", choices=TIMERS, default="graph",
                    help="graph (default): the calls captured in a CUDA graph, without the host's launch path; events: "
                         "do_bench around each Python launch, which counted vLLM's Python launch path into its "
                         "small-B times (replayssm_py/peer_timing.py)")
    ap.add_argument("--csv", default=None, help="also write the times as CSV (atomically, at the end)")
    ap.add_argument("--force", action="store_true", help="replace --csv if it exists (never done without it)")
    args = ap.parse_args(argv)
    if any(b <= 0 for b in args.batch) or args.window < 1:
        ap.error(f"--batch and --window must be positive (got {args.batch}, {args.window})")
    if args.csv and (why := output_refusal(args.csv, args.force, "--csv")):
        ap.error(why)  # before any peer runs: a run must not end in a refused write, nor replace results
    peers = ("vllm", "flashinfer") if args.peers == "both" else (args.peers,)
    # Every requested extract is checked before any peer runs (and before torch loads).
    wanted = {"vllm": pathlib.Path(args.vllm) / peers_vllm._OPS / "mamba_ssm.py",
              "flashinfer": pathlib.Path(args.flashinfer) / peers_flashinfer._SSU}
    for peer in peers:
        if not wanted[peer].is_file():
            print(f"bench_peers.py: {wanted[peer]}: not found; run scripts/fetch_peers.sh first", file=sys.stderr)
            return 2
    log = lambda line: print(line, flush=True)  # noqa: E731
    rows = []
    try:
        if "vllm" in peers:
            rows += run_vllm_bench(args.vllm, args.shapes, args.batch, args.window, log=log, timer=args.timer)
        if "flashinfer" in peers:
            rows += peers_flashinfer.run_flashinfer_bench(args.flashinfer, args.shapes, args.batch, args.window, log=log,
                                                          algorithms=tuple(args.flashinfer_algorithm), timer=args.timer)
    except FileNotFoundError as e:  # the peer's files were not fetched (or not built): say so, not a traceback
        print(f"bench_peers.py: {e}", file=sys.stderr)
        return 2
    if args.csv:
        # The timer travels with the times: scripts/decode_targets.py marks event-timed peers.
        write_csv_atomically(args.csv, ["model", "kernel", "batch", "us_per_step", "timer"],
                             [(*row, args.timer) for row in rows])
    return 0


if __name__ == "__main__":
    sys.exit(main())
