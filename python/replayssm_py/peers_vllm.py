"""vLLM's Mamba-2 decode kernels as outside peers of `replayssm bench` (scripts/bench_peers.py is the
command): its tuned conventional `selective_state_update` and its ReplaySSM kernel
`selective_state_update_replayssm_output_only`, imported at run time from the files of the vllm wheel
that scripts/fetch_peers.sh extracts (nothing of vLLM is in this repository). vLLM's package pulls in
its whole engine on import, so `load_vllm_mamba_ops` loads the few kernel modules by path behind
minimal stand-ins for the vLLM modules they import (platform queries, logging, Triton handles).

Before timing, every kernel's outputs (and the states it writes) are compared with a float64
evaluation of the recurrence on the same inputs (REPLAYSSM.md sections 1-3): the same oracle the
toolkit's own kernels are held to through the CPU decoders.

The recurrence in vLLM's terms (TIE_HDIM: one decay per head): a = exp(A dt), S <- a S + (dt x) B^T,
y = S C; ReplaySSM keeps the window's x, dt, B and reads y = (prod a) S_0 C + sum_j w_j (B_j . C)
dt_j x_j without materialising S, except at a flush (write_pos = L - 1), which writes S.
"""
import importlib.util
import logging
import math
import pathlib
import re
import sys
import types

from .peer_timing import time_peer_us
from .peers_fla import SHAPES

# The Mamba-2 shapes of the peers' table: name -> (key heads = ngroups, value heads, dstate = dk, headdim = dv).
MAMBA2_SHAPES = {name: (G, H, dk, dv) for name, (kind, G, H, dk, dv) in SHAPES.items() if kind == "mamba2"}
_OPS = "vllm/model_executor/layers/mamba/ops"


def _stub(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def load_vllm_mamba_ops(root):
    """Imports vLLM's mamba_ssm and selective_state_update_replayssm_output_only modules from an
    extracted wheel under `root` (a directory holding vllm/model_executor/layers/mamba/ops) and
    returns (selective_state_update, selective_state_update_replayssm_output_only, version)."""
    root = pathlib.Path(root)
    ops_dir = root / _OPS
    if not (ops_dir / "mamba_ssm.py").is_file():
        raise FileNotFoundError(f"{ops_dir}/mamba_ssm.py: not found; run scripts/fetch_peers.sh first")
    import torch
    import triton
    import triton.language as tl

    version = (root / "VERSION").read_text().strip() if (root / "VERSION").is_file() else "?"

    class Platform:  # vllm.platforms.current_platform, the queries these kernels make
        def is_rocm(self):
            return False

        def is_xpu(self):
            return False

        def is_cpu(self):
            return False

        def is_cuda(self):
            return True

        def get_device_name(self, device_id=0):
            return torch.cuda.get_device_name(device_id)

        def is_device_capability_family(self, family):
            major, minor = torch.cuda.get_device_capability()
            return (10 * major + minor) // 10 == family // 10

    class Logger(logging.LoggerAdapter):
        def info_once(self, msg, *args, **kwargs):
            self.info(msg, *args)

        def warning_once(self, msg, *args, **kwargs):
            self.warning(msg, *args)

    platform = Platform()
    _stub("vllm", __path__=[str(root / "vllm")])
    _stub("vllm.envs", VLLM_TUNED_CONFIG_FOLDER=None)
    _stub("vllm._custom_ops")
    _stub("vllm.logger", init_logger=lambda name: Logger(logging.getLogger(name), {}))
    _stub("vllm.platforms", current_platform=platform)
    _stub("vllm.triton_utils", HAS_TRITON=True, tl=tl, triton=triton)
    _stub("vllm.utils", __path__=[])
    _stub("vllm.utils.platform_utils",
          get_device_name_as_file_name=lambda device_id=0: re.sub(r"[\s/]+", "_", platform.get_device_name(device_id)))
    for pkg in ("vllm.v1", "vllm.v1.attention", "vllm.v1.attention.backends"):
        _stub(pkg, __path__=[])
    _stub("vllm.v1.attention.backends.utils", NULL_BLOCK_ID=0)
    for pkg in ("vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.mamba"):
        _stub(pkg, __path__=[])
    _stub("vllm.model_executor.layers.mamba.ops", __path__=[str(ops_dir)])

    def load(stem):
        name = f"vllm.model_executor.layers.mamba.ops.{stem}"
        spec = importlib.util.spec_from_file_location(name, ops_dir / f"{stem}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    load("triton_helpers")
    ssm = load("mamba_ssm")
    load("replayssm_config")
    replay = load("selective_state_update_replayssm_output_only")
    return ssm.selective_state_update, replay.selective_state_update_replayssm_output_only, version


class Mamba2Inputs:
    """One decode step's inputs for B sequences in vLLM's layouts, and a window of L cached tokens per
    sequence at staggered positions write_pos[b] = b mod L (a flush where write_pos = L - 1)."""

    def __init__(self, shape, batch, window, seed=0):
        import torch

        G, H, dk, dv = shape
        gen = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"

        def uniform(lo, hi, *size, dtype=torch.float32):
            return (lo + (hi - lo) * torch.rand(*size, generator=gen, device=dev)).to(dtype)

        self.G, self.H, self.dk, self.dv, self.B, self.L = G, H, dk, dv, batch, window
        self.state = uniform(-0.5, 0.5, batch, H, dv, dk)
        self.x = uniform(-1.0, 1.0, batch, H, dv, dtype=torch.bfloat16)
        self.dt_head = uniform(0.01, 0.1, batch, H)
        self.A_head = uniform(-1.0, -0.1, H)  # a = exp(A dt) in (0.90, 0.999)
        self.Bv = uniform(-0.09, 0.09, batch, G, dk, dtype=torch.bfloat16)
        self.Cv = uniform(-0.09, 0.09, batch, G, dk, dtype=torch.bfloat16)
        # TIE_HDIM: one dt, A and dt_bias per head, broadcast over headdim (and dstate) by stride 0.
        self.dt = self.dt_head[:, :, None].expand(batch, H, dv)
        self.A = self.A_head[:, None, None].expand(H, dv, dk)
        self.D = torch.zeros(H, device=dev)[:, None].expand(H, dv)
        self.dt_bias = torch.zeros(H, device=dev)[:, None].expand(H, dv)
        self.out = torch.empty(batch, H, dv, device=dev, dtype=torch.bfloat16)
        self.x_cache = uniform(-1.0, 1.0, batch, H, window, dv, dtype=torch.bfloat16)
        self.dt_cache = uniform(0.01, 0.1, batch, H, window)
        self.B_cache = uniform(-0.09, 0.09, batch, G, window, dk, dtype=torch.bfloat16)
        self.bc_pre = torch.zeros(batch, G, window, device=dev)
        self.write_pos = (torch.arange(batch, device=dev, dtype=torch.int32) % window).contiguous()
        self.is_flush = (self.write_pos == window - 1).contiguous()

    def conventional_reference(self, state0):
        """float64: S = a S0 + (dt x) B^T, y = S C."""
        d = lambda t: t.to(__import__("torch").float64)
        rep = self.H // self.G
        a = (d(self.A_head)[None, :] * d(self.dt_head)).exp()
        Bh = d(self.Bv).repeat_interleave(rep, dim=1)
        Ch = d(self.Cv).repeat_interleave(rep, dim=1)
        S = a[:, :, None, None] * d(state0) + (d(self.dt_head)[:, :, None] * d(self.x))[..., None] * Bh[:, :, None, :]
        return (S * Ch[:, :, None, :]).sum(-1), S

    def replay_reference(self, state0, x_cache0, dt_cache0, B_cache0):
        """float64 outputs of one staggered ReplaySSM step from the checkpoint state0 and the caches as
        they were before the call, and the states the flush rows write."""
        import torch

        d = lambda t: t.to(torch.float64)
        rep = self.H // self.G
        ys = torch.empty(self.B, self.H, self.dv, dtype=torch.float64, device="cuda")
        flushed = {}
        for b in range(self.B):
            wp = int(self.write_pos[b])
            dts = torch.cat([d(dt_cache0[b, :, :wp]), d(self.dt_head[b])[:, None]], dim=1)  # [H][wp+1]
            xs = torch.cat([d(x_cache0[b, :, :wp]), d(self.x[b])[:, None]], dim=1)  # [H][wp+1][dv]
            Bs = torch.cat([d(B_cache0[b, :, :wp]), d(self.Bv[b])[:, None]], dim=1).repeat_interleave(rep, dim=0)
            dA = d(self.A_head)[:, None] * dts  # [H][wp+1]
            total = dA.sum(1)
            weights = dts * (total[:, None] - dA.cumsum(1)).exp()  # dt_j prod_{l>j} a_l
            S = total.exp()[:, None, None] * d(state0[b]) + torch.einsum("hj,hjv,hjk->hvk", weights, xs, Bs)
            ys[b] = (S * d(self.Cv[b]).repeat_interleave(rep, dim=0)[:, None, :]).sum(-1)
            if wp == self.L - 1:
                flushed[b] = S
        return ys, flushed


def _excess(got, want, tol):
    """max |got - want| / (tol (rms(want) + |want|)), the C++ bench's comparison rule."""
    import torch

    rms = want.pow(2).mean().sqrt()
    e = (got.to(torch.float64) - want).abs() / (tol * (rms + want.abs()))
    return float(torch.nan_to_num(e, nan=math.inf).max())


def run_vllm_bench(root, shapes=("nemotron-3-nano-4b", "nemotron-3-super"), batches=(32, 256), window=16, log=print,
                   timer="graph"):
    """Validates, then times, vLLM's conventional and ReplaySSM Mamba-2 decode kernels (FP32 state,
    staggered windows; `timer`: peer_timing.TIMERS); returns rows (model, kernel, batch, us per step)."""
    ssu, ssu_replay, version = load_vllm_mamba_ops(root)  # first: a missing extract is reported before torch loads
    import torch
    import triton

    log(f"# vLLM {version} Mamba-2 decode kernels (from the wheel's files), torch {torch.__version__}, "
        f"triton {triton.__version__}, {torch.cuda.get_device_name()}; L = {window}, FP32 state, outputs bf16; "
        f"timer: {timer}")
    log("| model | kernel | B | us/step | check: max |d| / (tol (rms + |ref|)) |")
    log("|---|---|---|---|---|")
    rows = []
    for name in shapes:
        for B in batches:
            inp = Mamba2Inputs(MAMBA2_SHAPES[name], B, window)

            def conventional():
                ssu(inp.state, inp.x, inp.dt, inp.A, inp.Bv, inp.Cv, inp.D, inp.dt_bias, out=inp.out)

            def replay():
                ssu_replay(inp.state, inp.x, inp.dt, inp.A, inp.Bv, inp.Cv, x_cache=inp.x_cache,
                           dt_cache=inp.dt_cache, B_cache=inp.B_cache, bc_pre=inp.bc_pre, write_pos=inp.write_pos,
                           is_flush=inp.is_flush, max_cache_len=window, out=inp.out)

            # Validation first. Outputs are bf16 (vLLM's activation dtype): 1e-2 of (rms + |ref|). The
            # conventional kernel's state is fp32 arithmetic on exact bf16 inputs: 1e-5. The ReplaySSM
            # flush rounds dt_j w_j B_j to the activation dtype before its tf32x3 dot: 1e-2.
            state0 = inp.state.clone()
            y_ref, S_ref = inp.conventional_reference(state0)
            conventional()
            torch.cuda.synchronize()
            ex_y, ex_s = _excess(inp.out, y_ref, 1e-2), _excess(inp.state, S_ref, 1e-5)
            if not (ex_y <= 1.0 and ex_s <= 1.0):
                raise RuntimeError(f"vLLM selective_state_update on {name} B={B} differs from the float64 "
                                   f"reference: outputs {ex_y:.3g}, states {ex_s:.3g} (x tolerance)")
            inp.state.copy_(state0)
            caches = (inp.x_cache.clone(), inp.dt_cache.clone(), inp.B_cache.clone())
            y_ref, flushed = inp.replay_reference(state0, *caches)
            replay()
            torch.cuda.synchronize()
            ex_ry = _excess(inp.out, y_ref, 1e-2)
            ex_rs = max([_excess(inp.state[b], S, 1e-2) for b, S in flushed.items()] or [0.0])
            if not (ex_ry <= 1.0 and ex_rs <= 1.0):
                raise RuntimeError(f"vLLM selective_state_update_replayssm_output_only on {name} B={B} differs "
                                   f"from the float64 reference: outputs {ex_ry:.3g}, flushed states {ex_rs:.3g}")
            inp.state.copy_(state0)
            for label, fn, ex in (("vllm selective_state_update (conventional)", conventional, max(ex_y, ex_s)),
                                  ("vllm replayssm_output_only (staggered)", replay, max(ex_ry, ex_rs))):
                fn()
                torch.cuda.synchronize()
                us = time_peer_us(fn, timer)
                rows.append((name, label, B, us))
                log(f"| {name} | {label} | {B} | {us:.2f} | {ex:.3f} |")
    return rows
