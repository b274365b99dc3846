#!/usr/bin/env python3
"""Outside peer for `replayssm bench`: flash-linear-attention's Triton decode kernels on the
paper's shapes (one decode step, T = 1, FP32 state read and written), timed with
triton.testing.do_bench (median), bytes = state read + state written, as in the C++ bench.

  GDN shapes:     fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule (GQA: H key heads, HV value heads)
  Mamba-2 shapes: fla.ops.simple_gla.fused_recurrent_simple_gla (head-wise scalar decay; keys and
                  queries expanded to the value heads, as that kernel has no GQA)

Runs on the device machine (torch + triton there); fla is carried as wheels (docs/BENCHMARKS.md).
"""
import argparse
import csv
import sys

import torch
import triton

SHAPES = {  # name: (kind, key heads, value heads, dk, dv)   REPLAYSSM.md section 8
    "nemotron-3-nano-4b": ("mamba2", 8, 96, 128, 80),
    "nemotron-3-super": ("mamba2", 8, 128, 128, 64),
    "qwen3.5-4b": ("gdn", 16, 32, 128, 128),
    "qwen3.5-122b-a10b": ("gdn", 16, 64, 128, 128),
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128, 256, 512])
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    from fla.ops.simple_gla import fused_recurrent_simple_gla
    import fla
    torch.manual_seed(0)
    dev = "cuda"
    rows = []
    print(f"# flash-linear-attention {getattr(fla, '__version__', '?')}, torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    print("| model | kernel | B | us/step | MB/step | GB/s |")
    print("|---|---|---|---|---|---|")
    for name, (kind, G, H, dk, dv) in SHAPES.items():
        for B in args.batch:
            state = torch.randn(B, H, dk, dv, device=dev, dtype=torch.float32) * 0.1
            v = torch.randn(B, 1, H, dv, device=dev, dtype=torch.bfloat16)
            g = -torch.rand(B, 1, H, device=dev, dtype=torch.float32) * 0.1  # log decay
            if kind == "gdn":
                q = torch.nn.functional.normalize(torch.randn(B, 1, G, dk, device=dev), dim=-1).to(torch.bfloat16)
                k = torch.nn.functional.normalize(torch.randn(B, 1, G, dk, device=dev), dim=-1).to(torch.bfloat16)
                beta = torch.rand(B, 1, H, device=dev, dtype=torch.bfloat16)
                fn = lambda: fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                              output_final_state=True)
                label = "fla fused_recurrent_gated_delta_rule"
            else:
                q = (torch.randn(B, 1, H, dk, device=dev) * 0.1).to(torch.bfloat16)
                k = (torch.randn(B, 1, H, dk, device=dev) * 0.1).to(torch.bfloat16)
                fn = lambda: fused_recurrent_simple_gla(q, k, v, g=g, initial_state=state, output_final_state=True)
                label = "fla fused_recurrent_simple_gla"
            fn()
            torch.cuda.synchronize()
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            us = ms * 1000
            bytes_ = 2 * state.numel() * 4
            rows.append((name, label, B, us, bytes_))
            print(f"| {name} | {label} | {B} | {us:.2f} | {bytes_ / 1e6:.2f} | {bytes_ / (us * 1e-6) / 1e9:.0f} |", flush=True)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "kernel", "batch", "us_per_step", "bytes_per_step"])
            w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
