"""FlashInfer 0.7.2's ReplaySSM Mamba-2 decode kernel `flashinfer.mamba.checkpointing_ssu` as an outside
peer of `replayssm bench` (scripts/bench_peers.py --peers flashinfer is the command), imported at run time
from the files of the flashinfer-python wheel that scripts/fetch_peers.sh extracts into
.peers/flashinfer-0.7.2 (nothing of FlashInfer is in this repository). FlashInfer's package __init__
imports ~900 modules (CUTLASS DSL, cuDNN, TVM), so `load_flashinfer_checkpointing_ssu` puts bare
stand-ins for the packages `flashinfer`, `flashinfer.jit`, `flashinfer.jit.mamba`, `flashinfer.mamba`
and `flashinfer.fused_moe` (each with __path__ into the extract) into sys.modules and imports
flashinfer.mamba.checkpointing_ssu through them: 22 FlashInfer modules load (api_logging, autotuner,
compilation_context, fused_moe.utils, jit.core/cpp_ext/env/utils, utils, ...). Besides torch they need
apache-tvm-ffi 0.1.15.post2 (carried: the device image lacks it), jinja2, filelock, nvidia-ml-py, tqdm
(in the device image).

The CUDA module. checkpointing_ssu JIT-compiles data/csrc/checkpointing_ssu{,_kernel_inst,_jit_binding}.cu
against data/include + CUTLASS/CCCL/spdlog headers into one TVM-FFI .so per specialisation (dtypes, dim,
dstate, npredicted, max_window, heads_per_group, ngroups). `build_aot` drives FlashInfer's own
gen_checkpointing_ssu_module(...).build() with FLASHINFER_CUDA_ARCH_LIST="9.0a" on the build machine
(nvcc here, no GPU needed) and installs each .so where FlashInfer's JIT looks for an AOT artifact,
flashinfer/data/aot/<uri>/<uri>.so, which JitSpec.try_load loads without compiling. The device then needs
no headers and compiles nothing. One .so per paper shape: FP32 state, bf16 x/B/C/out, fp32 dt/A,
int32 indices, npredicted (T) = 1, max_window = L = 16 (nemotron-3-super: 1.4 MiB, 522 s of nvcc on 2 cores).
nemotron-3-nano-4b (headdim 80) does NOT compile in FlashInfer 0.7.2: the launcher instantiates both
d_split = 1 and 2 for every DIM, and nvcc stops on CuTe/kernel static_asserts for D_PER_CTA = 40 ("D_PER_CTA
must be divisible by 16 (m16n8 atom)", "... multiple of MMA::M (16)", "DIM_PER_WARP ... multiple of 4") and
also for D_PER_CTA = 80 (CuTe "Shape Divisibility Condition", "Stride Divisibility Condition", swizzle
"Requires pow2 shape*stride"); build_aot records nvcc's errors in flashinfer/data/aot/<uri>.unbuildable and
the bench prints a "not run" row for that shape.

FlashInfer's contract (read from mamba/checkpointing_ssu.py and data/csrc/checkpointing_ssu.cu,
include/flashinfer/mamba/kernel_checkpointing_ssu.cuh, launch_checkpointing_ssu.cuh):
  state (cache, H, dim, dstate)     the checkpoint S_0 of each slot; written only at a flush.
  x_cache (cache, H, R, dim), B_cache (cache, G, R, dstate), dt_cache (cache, H, R) f32: a ring of
                                    R = max_window + T rows per slot holding the tokens since the checkpoint
                                    (dt_cache holds the processed dt, after dt_bias/softplus).
  ring_start (cache,) i32           ring row of the oldest live token; the HOST advances it after a flush.
  prev_num_accepted_tokens (cache,) i32 = p, the old tokens in the ring to replay.
  x, dt, B, C, out (batch, T, ...)  the new tokens; dt/A tie_hdim (stride 0 over dim/dstate).
  Per step and slot: the new tokens are appended at ring rows (ring_start + p + i) mod R; y is read
  from S_0, the p old tokens and the new ones without writing S; if p + T > max_window (a flush) the
  kernel replays the p old tokens into S and WRITES S = S after the p old tokens (not the new ones,
  which stay in the ring as the next window's first rows); the host then sets ring_start += p,
  p = T. State dtypes: fp32, bf16, fp16 (optional Philox stochastic rounding of fp16 stores), and
  int8 / fp8_e4m3 with a per-(slot, head, dim) fp32 decode scale `state_scale` (d_split = 1 only).
  Two code paths: a monolithic kernel (grid d_split x batch x H, 4 warps), and with the caller's scratch
  trio (cb_scaled, cumAdt_vec, cb_old) a "two-kernel" precompute + persistent main pair; algorithm="auto"
  goes through FlashInfer's autotuner (fallback without a tuned tactic: two-kernel when
  batch * H >= SM count, else monolith). Both use bf16 mma.sync (m16n8k16): the FP32 state is narrowed
  to bf16 in registers for the C.S product, and the replay's per-token coefficients dt_j w_j B_j are
  bf16 operands accumulated in fp32 onto the fp32 state.

Our experiment mapped onto it (T = 1, L = 16, TIE_HDIM, B sequences each in its own slot):
  max_window = L, so R = L + 1 ring rows; p[b] = 1 + (b mod L) old tokens, ring_start[b] = 7 b mod R
  (arbitrary heads, so replay windows wrap around the ring). p = L is a flush: the rows b = L - 1 mod L,
  1/L of the batch, as in the vLLM rows; every other row reads y from S_0 plus p + 1 tokens. This is
  FlashInfer's steady state (after a flush p restarts at 1 = the token that triggered it), so it
  replays 2..17 tokens per output where vLLM's window holds 1..16, and its flush writes the state after
  L old tokens where vLLM's writes the state after L tokens including the current one: the same traffic.
  D, z, dt_bias absent, dt_softplus off (as in the vLLM rows).

Validation before timing, against a float64 evaluation on the same inputs (`ring_window_reference`):
outputs, the states written at the flush rows, that no other row's state changes, and the ring rows
the step appends (x, B, dt of the new token at row (ring_start + p) mod R, exact copies).

GDN decode (gated delta rule) in FlashInfer 0.7.2 is NOT part of this peer. Measured facts:
  - flashinfer/gdn_decode.py: gated_delta_rule_decode_pretranspose / gated_delta_rule_decode /
    gated_delta_rule_mtp dispatch to gdn_kernels/gdn_decode_{pretranspose,nontranspose,bf16_state,mtp}.py,
    CuTe DSL kernels (import cutlass, cutlass.cute, cuda.bindings) documented for SM90+, which need
    nvidia-cutlass-dsl>=4.6.2a0: nvidia-cutlass-dsl 4.7.1 (10 KB) + -libs-base (2.8 MB) + -libs-core
    (1.2 MB) + -libs-cu13 (88.3 MB wheel; 224 MB unpacked: _cutlass_ir.cu13 181 MB,
    libcute_dsl_runtime.so 43 MB). That is over the whole 64 MiB carry limit of the device machine.
  - The C++ "Cake" GDN decode backend (jit/cake_gdn.py, arch_for_compute_capability) accepts only
    SM100a/SM103a.
  - The GDN ReplaySSM path (gated_delta_rule_mtp(cache_replayssm=True), gdn_kernels/
    gdn_decode_mtp_replayssm_tcgen.py, gdn_replayssm_spec_fold*.py) raises "ReplaySSM caching currently
    requires SM100/SM103" (tcgen05); it cannot run on an H200 at all.
"""
import importlib
import os
import pathlib
import shutil
import sys

from .peer_timing import time_peer_us
from .peers_vllm import MAMBA2_SHAPES, Mamba2Inputs, _excess, _stub

VERSION = "0.7.2"
TVM_FFI_VERSION = "0.1.15.post2"
_SSU = "flashinfer/mamba/checkpointing_ssu.py"
# Packages whose __init__ would pull in the rest of FlashInfer: bare stand-ins with __path__ instead.
_STUB_PACKAGES = ("flashinfer", "flashinfer.jit", "flashinfer.jit.mamba", "flashinfer.mamba", "flashinfer.fused_moe")
ALGORITHMS = ("monolith", "two-kernel")


def staggered_ring(batch, window):
    """The staggered windows of the experiment in FlashInfer's ring terms: per sequence b the old-token
    count p[b] = 1 + (b mod L) (FlashInfer's prev_num_accepted_tokens), the ring head ring_start[b] =
    7 b mod (L + 1), and whether the step flushes (p + T > max_window with T = 1, max_window = L)."""
    ring = window + 1
    prev = [1 + b % window for b in range(batch)]
    start = [(7 * b) % ring for b in range(batch)]
    flush = [p + 1 > window for p in prev]
    return prev, start, flush


def ring_window_reference(A_head, dt_new, x_new, B_new, C_new, state0, x_cache, dt_cache, B_cache, ring_start, prev):
    """float64 evaluation of one T = 1 step of FlashInfer's ring contract (TIE_HDIM). Shapes: A_head [H],
    dt_new [B][H], x_new [B][H][dv], B_new / C_new [B][G][dk], state0 [B][H][dv][dk], x_cache [B][H][R][dv],
    dt_cache [B][H][R], B_cache [B][G][R][dk], ring_start / prev [B] (ints). Returns y [B][H][dv] and
    {b: state written} for the flush rows (prev[b] = R - 1): the state after the prev[b] old tokens.
    a_j = exp(A dt_j), S_p = (prod a) S_0 + sum_j dt_j (prod_{l>j} a_l) x_j B_j^T, y = (a S_p + dt x B^T) C."""
    import torch

    d = lambda t: t.to(torch.float64)
    Bn, H, R = dt_cache.shape
    rep = H // B_new.shape[1]
    A = d(A_head)
    ys, flushed = [], {}
    for b in range(Bn):
        p, rs = int(prev[b]), int(ring_start[b])
        rows = torch.tensor([(rs + j) % R for j in range(p)], dtype=torch.long, device=dt_cache.device)
        dts = torch.cat([d(dt_cache[b][:, rows]), d(dt_new[b])[:, None]], dim=1)  # [H][p+1]
        xs = torch.cat([d(x_cache[b][:, rows]), d(x_new[b])[:, None]], dim=1)  # [H][p+1][dv]
        Bs = torch.cat([d(B_cache[b][:, rows]), d(B_new[b])[:, None]], dim=1).repeat_interleave(rep, dim=0)
        dA = A[:, None] * dts
        cum = dA.cumsum(1)

        def state_after(n):  # the state after the first n tokens of the window
            total = cum[:, n - 1] if n else torch.zeros_like(A)
            w = dts[:, :n] * (total[:, None] - cum[:, :n]).exp()
            return total.exp()[:, None, None] * d(state0[b]) + torch.einsum("hj,hjv,hjk->hvk", w, xs[:, :n], Bs[:, :n])

        S = state_after(p + 1)
        ys.append((S * d(C_new[b]).repeat_interleave(rep, dim=0)[:, None, :]).sum(-1))
        if p == R - 1:
            flushed[b] = state_after(p)
    return torch.stack(ys), flushed


def _module_args(shape, window):
    """gen_checkpointing_ssu_module's arguments for a paper shape, as FlashInfer's wrapper derives them
    from our tensors: (state, input, dt, weight = dt without D/dt_bias, A, state index) dtypes, no state
    scale, dim, dstate, npredicted = 1, max_window = L, heads per group, groups, philox rounds 0, no PDL."""
    import torch

    G, H, dk, dv = shape
    f32 = torch.float32
    return (f32, torch.bfloat16, f32, f32, f32, torch.int32, None, dv, dk, 1, window, H // G, G, 0, False)


def _install_stubs(root):
    root = pathlib.Path(root)
    for name in _STUB_PACKAGES:
        _stub(name, __path__=[str(root.joinpath(*name.split(".")))])


def load_flashinfer_checkpointing_ssu(root):
    """Imports flashinfer.mamba.checkpointing_ssu from an extracted wheel under `root` (a directory
    holding flashinfer/) and returns (checkpointing_ssu, allocate_checkpointing_ssu_scratch, version,
    FlashInfer's jit package namespace {env, get_uri})."""
    root = pathlib.Path(root)
    if not (root / _SSU).is_file():
        raise FileNotFoundError(f"{root / _SSU}: not found; run scripts/fetch_peers.sh first")
    version = (root / "VERSION").read_text().strip() if (root / "VERSION").is_file() else "?"
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(root.resolve() / ".workspace"))
    _install_stubs(root)
    ssu = importlib.import_module("flashinfer.mamba.checkpointing_ssu")
    jit_ssu = importlib.import_module("flashinfer.jit.mamba.checkpointing_ssu")
    env = importlib.import_module("flashinfer.jit.env")
    jit = {"env": env, "get_uri": jit_ssu.get_checkpointing_ssu_uri, "gen_module": jit_ssu.gen_checkpointing_ssu_module}
    return ssu.checkpointing_ssu, ssu.allocate_checkpointing_ssu_scratch, version, jit


def build_aot(root, shapes=tuple(MAMBA2_SHAPES), window=16, arch="9.0a", log=print):
    """Builds FlashInfer's checkpointing_ssu module for each shape ahead of time with FlashInfer's own JIT
    spec (its flags, its ninja file) for `arch`, and installs it as the AOT artifact
    flashinfer/data/aot/<uri>/<uri>.so of the extract. Needs torch (no GPU), apache-tvm-ffi, nvcc, ninja
    and the headers under flashinfer/data. Returns the installed paths."""
    root = pathlib.Path(root).resolve()
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch  # read when flashinfer.jit.env is imported
    os.environ["FLASHINFER_WORKSPACE_BASE"] = str(root / ".build")
    _, _, _, jit = load_flashinfer_checkpointing_ssu(root)
    out = []
    for name in shapes:
        args = _module_args(MAMBA2_SHAPES[name], window)
        uri = jit["get_uri"](*args)
        dest = jit["env"].FLASHINFER_AOT_DIR / uri / f"{uri}.so"
        failed = _unbuildable_marker(jit["env"], uri)
        if dest.is_file():
            log(f"{name}: {dest} (already built)")
        elif failed.is_file():
            log(f"{name}: {uri} does not compile (recorded in {failed})")
        else:
            spec = jit["gen_module"](*args)
            log(f"{name}: building {uri} for sm_{arch.replace('.', '')} ...")
            try:
                spec.build(verbose=False)
            except RuntimeError as e:  # FlashInfer's sources reject this shape: keep nvcc's reasons for the bench
                errors = [line.strip() for line in str(e).splitlines() if "error" in line]
                failed.parent.mkdir(parents=True, exist_ok=True)
                failed.write_text("\n".join(dict.fromkeys(errors)) + "\n")
                log(f"{name}: {uri} does not compile for sm_{arch.replace('.', '')}:\n  " + "\n  ".join(dict.fromkeys(errors)))
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(spec.jit_library_path, dest)
            log(f"{name}: {dest} ({dest.stat().st_size / 2**20:.1f} MiB)")
        out.append(dest)
    return out


def _unbuildable_marker(env, uri):
    """Where build_aot records nvcc's errors for a specialisation FlashInfer's sources reject."""
    return env.FLASHINFER_AOT_DIR / f"{uri}.unbuildable"


class FlashInferInputs:
    """One T = 1 decode step for B sequences in FlashInfer's layouts. The state, x, dt, A, B and C are
    Mamba2Inputs' (the vLLM rows' inputs, same seed), the ring caches are drawn from the same ranges."""

    def __init__(self, shape, batch, window, seed=0):
        import torch

        base = Mamba2Inputs(shape, batch, window, seed)
        G, H, dk, dv = shape
        R, dev = window + 1, "cuda"
        gen = torch.Generator(device=dev).manual_seed(seed + 1)

        def uniform(lo, hi, *size, dtype=torch.float32):
            return (lo + (hi - lo) * torch.rand(*size, generator=gen, device=dev)).to(dtype)

        self.G, self.H, self.dk, self.dv, self.B, self.L, self.R = G, H, dk, dv, batch, window, R
        self.base = base
        self.state = base.state  # [B][H][dv][dk] fp32, one slot per sequence
        self.x = base.x[:, None]  # [B][1][H][dv] bf16
        self.dt = base.dt_head[:, None, :, None].expand(batch, 1, H, dv)  # tie_hdim: stride 0 over dim
        self.A = base.A  # [H][dv][dk], strides (1, 0, 0)
        self.Bv, self.Cv = base.Bv[:, None], base.Cv[:, None]  # [B][1][G][dk] bf16
        self.out = torch.empty(batch, 1, H, dv, device=dev, dtype=torch.bfloat16)
        self.x_cache = uniform(-1.0, 1.0, batch, H, R, dv, dtype=torch.bfloat16)
        self.B_cache = uniform(-0.09, 0.09, batch, G, R, dk, dtype=torch.bfloat16)
        self.dt_cache = uniform(0.01, 0.1, batch, H, R)
        prev, start, flush = staggered_ring(batch, window)
        self.prev = torch.tensor(prev, dtype=torch.int32, device=dev)
        self.ring_start = torch.tensor(start, dtype=torch.int32, device=dev)
        self.flush = torch.tensor(flush, dtype=torch.bool, device=dev)

    def reference(self, state0, caches):
        x_cache, dt_cache, B_cache = caches
        return ring_window_reference(self.base.A_head, self.base.dt_head, self.base.x, self.base.Bv, self.base.Cv,
                                     state0, x_cache, dt_cache, B_cache, self.ring_start.tolist(), self.prev.tolist())

    def appended_rows_ok(self):
        """The step's cache appends: the new token's x, B and dt at ring row (ring_start + p) mod R."""
        import torch

        b = torch.arange(self.B, device="cuda")
        row = ((self.ring_start + self.prev) % self.R).long()
        return (torch.equal(self.x_cache[b, :, row], self.base.x)
                and torch.equal(self.B_cache[b, :, row], self.base.Bv)
                and torch.equal(self.dt_cache[b, :, row], self.base.dt_head))


def run_flashinfer_bench(root, shapes=("nemotron-3-nano-4b", "nemotron-3-super"), batches=(32, 256), window=16,
                         log=print, algorithms=ALGORITHMS, timer="graph"):
    """Validates, then times, FlashInfer's checkpointing_ssu (FP32 state, staggered windows, T = 1) with
    each algorithm ("monolith", "two-kernel"); returns rows (model, kernel, batch, us per step)."""
    root = pathlib.Path(root)
    if not (root / _SSU).is_file():  # before torch loads
        raise FileNotFoundError(f"{root / _SSU}: not found; run scripts/fetch_peers.sh first")
    if window > 16:
        raise ValueError(f"FlashInfer's checkpointing_ssu holds at most 16 cache tokens (max_window), got L = {window}")
    ssu, scratch, version, jit = load_flashinfer_checkpointing_ssu(root)
    import torch
    import triton

    unbuildable = {}
    for name in shapes:  # a missing prebuilt module, with no headers to JIT-compile it, is a fetch problem
        uri = jit["get_uri"](*_module_args(MAMBA2_SHAPES[name], window))
        failed = _unbuildable_marker(jit["env"], uri)
        if failed.is_file():
            unbuildable[name] = "; ".join(failed.read_text().split("\n")[:3]).strip("; ")
        elif not jit["env"].get_aot_path(uri).is_file() and not (jit["env"].FLASHINFER_INCLUDE_DIR / "flashinfer").is_dir():
            raise FileNotFoundError(f"{jit['env'].get_aot_path(uri)}: no prebuilt module for {name} (L = {window}) and "
                                    f"no headers to compile it; run scripts/fetch_peers.sh")
    log(f"# FlashInfer {version} checkpointing_ssu (from the wheel's files), torch {torch.__version__}, "
        f"triton {triton.__version__}, {torch.cuda.get_device_name()}; L = {window} (max_window, ring of L + 1), "
        f"T = 1, FP32 state, outputs bf16; timer: {timer}")
    log("| model | kernel | B | us/step | check: outputs, flushed states: max |d| / (tol (rms + |ref|)) |")
    log("|---|---|---|---|---|")
    rows = []
    for name in shapes:
        if name in unbuildable:
            log(f"| {name} | flashinfer checkpointing_ssu | - | not run | FlashInfer's sources do not compile for this "
                f"shape (fetch_peers.sh's nvcc): {unbuildable[name]} |")
            continue
        for B in batches:
            inp = FlashInferInputs(MAMBA2_SHAPES[name], B, window)
            cb_scaled, cumAdt_vec, cb_old = scratch(B, inp.H, 1, window, torch.bfloat16, "cuda")

            def step(algorithm):
                extra = {} if algorithm == "monolith" else dict(cb_scaled=cb_scaled, cumAdt_vec=cumAdt_vec, cb_old=cb_old)
                ssu(inp.state, inp.x_cache, inp.B_cache, inp.dt_cache, inp.ring_start, inp.prev, inp.x, inp.dt,
                    inp.A, inp.Bv, inp.Cv, inp.out, algorithm=algorithm, **extra)

            state0 = inp.state.clone()
            caches = (inp.x_cache.clone(), inp.dt_cache.clone(), inp.B_cache.clone())
            y_ref, flushed = inp.reference(state0, caches)
            keep = ~inp.flush
            for algorithm in algorithms:
                inp.state.copy_(state0)
                for t, t0 in zip((inp.x_cache, inp.dt_cache, inp.B_cache), caches):
                    t.copy_(t0)
                inp.out.fill_(float("nan"))
                step(algorithm)
                torch.cuda.synchronize()
                # Outputs are bf16 (the activation dtype), and FlashInfer narrows the fp32 state and the
                # C, B operands to bf16 for its mma.sync (2^-9 relative each, summed over dstate with random
                # signs): 1e-2 of (rms + |ref|), vLLM's output rule. Flushed states: fp32 accumulation onto
                # the fp32 state, but each replayed token's dt_j w_j B_j is a bf16 mma operand (2^-9
                # relative): 1e-2, vLLM's ReplaySSM flush rule. Unflushed states and the appended cache
                # rows must be bit-exact.
                ex_y = _excess(inp.out[:, 0], y_ref, 1e-2)
                ex_s = max([_excess(inp.state[b], S, 1e-2) for b, S in flushed.items()] or [0.0])
                kept = torch.equal(inp.state[keep], state0[keep])
                appended = inp.appended_rows_ok()
                if not (ex_y <= 1.0 and ex_s <= 1.0 and kept and appended):
                    raise RuntimeError(f"FlashInfer checkpointing_ssu ({algorithm}) on {name} B={B} differs from the "
                                       f"float64 reference: outputs {ex_y:.3g}, flushed states {ex_s:.3g} (x tolerance), "
                                       f"unflushed states unchanged: {kept}, appended cache rows exact: {appended}")
                inp.state.copy_(state0)
                label = f"flashinfer checkpointing_ssu {algorithm} (staggered)"
                fn = lambda: step(algorithm)  # noqa: E731
                fn()
                torch.cuda.synchronize()
                us = time_peer_us(fn, timer)
                rows.append((name, label, B, us))
                log(f"| {name} | {label} | {B} | {us:.2f} | {ex_y:.3f}, {ex_s:.3f} |")
    return rows


def main(argv=None):
    """python3 -m replayssm_py.peers_flashinfer build-aot ROOT [--shapes ...] [--window L] [--arch 9.0a]"""
    import argparse

    ap = argparse.ArgumentParser(prog="python3 -m replayssm_py.peers_flashinfer", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-aot", help="prebuild checkpointing_ssu for the paper shapes into the extract")
    b.add_argument("root")
    b.add_argument("--shapes", nargs="+", default=list(MAMBA2_SHAPES), choices=list(MAMBA2_SHAPES))
    b.add_argument("--window", type=int, default=16)
    b.add_argument("--arch", default="9.0a")
    args = ap.parse_args(argv)
    build_aot(args.root, args.shapes, args.window, args.arch, log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
