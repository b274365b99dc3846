"""flash-linear-attention's Triton decode kernels on the paper's shapes, the outside peer of
`replayssm bench` (scripts/bench_fla.py is the command): one decode step (T = 1), FP32 state read and
written, timed by peer_timing.time_peer_us (median; `timer`); bytes = state read + state written, as in the
C++ bench. Needs the `bench` extra (torch, triton, flash-linear-attention) and a CUDA GPU.

  GDN shapes:     fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule (GQA: H key heads, HV value heads)
  Mamba-2 shapes: fla.ops.simple_gla.fused_recurrent_simple_gla (head-wise scalar decay; keys and
                  queries expanded to the value heads, as that kernel has no GQA)
"""
from .files import write_csv_atomically
from .peer_timing import time_peer_us

SHAPES = {  # name: (kind, key heads, value heads, dk, dv)   REPLAYSSM.md section 8
    "nemotron-3-nano-4b": ("mamba2", 8, 96, 128, 80),
    "nemotron-3-super": ("mamba2", 8, 128, 128, 64),
    "qwen3.5-4b": ("gdn", 16, 32, 128, 128),
    "qwen3.5-122b-a10b": ("gdn", 16, 64, 128, 128),
}
DEFAULT_BATCHES = (1, 8, 32, 128, 256, 512)


def run_fla_bench(batches=DEFAULT_BATCHES, csv_path=None, log=print, timer="events"):
    """Times every shape at every batch size; prints a Markdown table through log and returns the rows
    (model, kernel, batch, us per step, bytes per step), also written to csv_path when given."""
    import fla
    import torch
    import triton
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    from fla.ops.simple_gla import fused_recurrent_simple_gla

    if any(b <= 0 for b in batches):
        raise ValueError(f"--batch: expected positive batch sizes, got {list(batches)}")
    torch.manual_seed(0)
    dev = "cuda"
    rows = []
    log(f"# flash-linear-attention {getattr(fla, '__version__', '?')}, torch {torch.__version__}, "
        f"triton {triton.__version__}, {torch.cuda.get_device_name()}; timer: {timer}")
    log("| model | kernel | B | us/step | MB/step | GB/s |")
    log("|---|---|---|---|---|---|")
    for name, (kind, G, H, dk, dv) in SHAPES.items():
        for B in batches:
            state = torch.randn(B, H, dk, dv, device=dev, dtype=torch.float32) * 0.1
            v = torch.randn(B, 1, H, dv, device=dev, dtype=torch.bfloat16)
            g = -torch.rand(B, 1, H, device=dev, dtype=torch.float32) * 0.1  # log decay
            if kind == "gdn":
                q = torch.nn.functional.normalize(torch.randn(B, 1, G, dk, device=dev), dim=-1).to(torch.bfloat16)
                k = torch.nn.functional.normalize(torch.randn(B, 1, G, dk, device=dev), dim=-1).to(torch.bfloat16)
                beta = torch.rand(B, 1, H, device=dev, dtype=torch.bfloat16)

                def fn():
                    return fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                            output_final_state=True)
                label = "fla fused_recurrent_gated_delta_rule"
            else:
                q = (torch.randn(B, 1, H, dk, device=dev) * 0.1).to(torch.bfloat16)
                k = (torch.randn(B, 1, H, dk, device=dev) * 0.1).to(torch.bfloat16)

                def fn():
                    return fused_recurrent_simple_gla(q, k, v, g=g, initial_state=state, output_final_state=True)
                label = "fla fused_recurrent_simple_gla"
            fn()
            torch.cuda.synchronize()
            us = time_peer_us(fn, timer, rep_ms=100)
            bytes_ = 2 * state.numel() * 4
            rows.append((name, label, B, us, bytes_))
            log(f"| {name} | {label} | {B} | {us:.2f} | {bytes_ / 1e6:.2f} | {bytes_ / (us * 1e-6) / 1e9:.0f} |")
    if csv_path:  # the caller checked it before the run (scripts/bench_fla.py: files.output_refusal)
        write_csv_atomically(csv_path, ["model", "kernel", "batch", "us_per_step", "bytes_per_step", "timer"],
                             [(*row, timer) for row in rows])
    return rows
