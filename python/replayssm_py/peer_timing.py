"""How the outside peers (peers_vllm, peers_flashinfer, peers_fla) are timed, in microseconds per call (median).

  events  triton.testing.do_bench: each call bracketed by CUDA events around its Python launch, after an L2 flush.
          A kernel shorter than its host-side launch path (Python wrapper, Triton launcher) is timed with the host's
          gaps in it. On one H100 (session 26, experiments/bench/decode_2026-12-06/session26/call4/) vLLM's ReplaySSM
          kernel on Nemotron-3-Super took 99.4 us at B = 32 under events and 54.7 us under graph; at B = 256,
          409.2 and 398.2 us.
  graph   triton.testing.do_bench_cudagraph: the calls captured back to back in one CUDA graph and replayed, as a
          serving loop runs its decode steps; no host launch in the timed region, and no L2 flush between calls
          (a state smaller than a few times L2 may then be partly read from it, as in `replayssm bench`'s staggered
          row, which reads one state copy through the L steps of a sample).

`replayssm bench` brackets each of its own samples with CUDA events from C++, whose launch path is a few
microseconds and, in the staggered row, overlaps the previous step's kernels; "graph" takes the host out of a peer's
time altogether, so a ratio "peer / ours" under it does not favour ours. "events" stays for comparison with the
earlier runs.
"""
TIMERS = ("events", "graph")


def time_peer_us(fn, timer="events", rep_ms=200):
    """Median time of one call of fn (a peer step, already validated and warmed up), in microseconds."""
    if timer not in TIMERS:
        raise ValueError(f"timer must be one of {TIMERS} (got {timer!r})")
    import torch
    import triton

    if timer == "events":
        return triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median") * 1000
    if timer == "graph":
        # A graph is captured on a side stream; it must see the default stream's work (the inputs) first.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                ms = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
        except RuntimeError as e:  # a peer whose call cannot be captured: say so rather than time it otherwise
            raise RuntimeError(f"the peer's call cannot be captured in a CUDA graph ({e}); use --timer events") from e
        torch.cuda.current_stream().wait_stream(side)
        return ms * 1000
