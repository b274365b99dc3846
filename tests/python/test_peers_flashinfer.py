"""CPU-side checks of the FlashInfer peer (python/replayssm_py/peers_flashinfer.py, scripts/bench_peers.py):
the staggered ring positions, the float64 reference against an independent token-by-token loop, the
refusal of an unfetched extract, and, where scripts/fetch_peers.sh has run (.peers/flashinfer-0.7.2; CI
does not fetch peers), the API of the extract that the peer relies on."""
import ast
import importlib.util
import pathlib
import subprocess
import sys

import pytest

from conftest import ROOT, checkout_env
from replayssm_py import peers_flashinfer
from replayssm_py.peers_flashinfer import MAMBA2_SHAPES, staggered_ring

EXTRACT = ROOT / ".peers" / f"flashinfer-{peers_flashinfer.VERSION}"
needs_extract = pytest.mark.skipif(not (EXTRACT / peers_flashinfer._SSU).is_file(),
                                   reason=f"{EXTRACT} not fetched (scripts/fetch_peers.sh)")


@pytest.mark.parametrize("batch,window", [(32, 16), (256, 16), (7, 4), (5, 1)])
def test_peers_staggered_ring_positions(batch, window):
    prev, start, flush = staggered_ring(batch, window)
    ring = window + 1
    assert len(prev) == len(start) == len(flush) == batch
    assert all(1 <= p <= window for p in prev) and all(0 <= s < ring for s in start)
    # Each sequence sits at its own place in its window, and exactly those at the window's end flush
    # (FlashInfer's rule p + T > max_window with T = 1): 1/L of every L consecutive sequences.
    assert prev == [1 + b % window for b in range(batch)]
    assert [b for b in range(batch) if flush[b]] == [b for b in range(batch) if b % window == window - 1]
    assert flush == [p + 1 > window for p in prev]
    for p, s in zip(prev, start):  # the appended row is never one of the rows the step replays
        old = {(s + j) % ring for j in range(p)}
        assert len(old) == p and (s + p) % ring not in old
    if window > 1 and batch >= ring:
        assert any(s + p > ring for p, s in zip(prev, start)), "some replay window should wrap the ring"


def test_peers_reference_matches_token_loop():
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(3)
    Bn, G, H, dk, dv, L = 6, 2, 4, 5, 3, 4
    R = L + 1
    u = lambda lo, hi, *s: lo + (hi - lo) * torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    A_head, dt_new = u(-1.0, -0.1, H), u(0.01, 0.5, Bn, H)
    x_new, B_new, C_new = u(-1, 1, Bn, H, dv), u(-1, 1, Bn, G, dk), u(-1, 1, Bn, G, dk)
    state0 = u(-1, 1, Bn, H, dv, dk)
    x_cache, dt_cache, B_cache = u(-1, 1, Bn, H, R, dv), u(0.01, 0.5, Bn, H, R), u(-1, 1, Bn, G, R, dk)
    prev, start, flush = staggered_ring(Bn, L)
    y, flushed = peers_flashinfer.ring_window_reference(A_head, dt_new, x_new, B_new, C_new, state0, x_cache,
                                                        dt_cache, B_cache, start, prev)
    assert sorted(flushed) == [b for b in range(Bn) if flush[b]] == [3]
    rep = H // G
    for b in range(Bn):
        for h in range(H):
            g = h // rep
            S = state0[b, h].clone()
            for j in range(prev[b]):  # the old tokens, oldest first, from the ring
                r = (start[b] + j) % R
                a = torch.exp(A_head[h] * dt_cache[b, h, r])
                S = a * S + dt_cache[b, h, r] * torch.outer(x_cache[b, h, r], B_cache[b, g, r])
            if b in flushed:
                torch.testing.assert_close(flushed[b][h], S, rtol=1e-12, atol=1e-12)
            S = torch.exp(A_head[h] * dt_new[b, h]) * S + dt_new[b, h] * torch.outer(x_new[b, h], B_new[b, g])
            torch.testing.assert_close(y[b, h], S @ C_new[b, g], rtol=1e-12, atol=1e-12)


def test_peers_bench_refuses_unfetched_flashinfer_without_torch(tmp_path):
    code = (
        "import runpy, sys\n"
        f"mod = runpy.run_path({str(ROOT / 'scripts' / 'bench_peers.py')!r})\n"
        f"rc = mod['main'](['--peers', 'flashinfer', '--flashinfer', {str(tmp_path / 'none')!r}])\n"
        "print(rc, 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=checkout_env())
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr
    assert r.stderr.count("\n") == 1 and "run scripts/fetch_peers.sh first" in r.stderr
    # "both" refuses before vLLM runs when either extract is missing
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_peers.py"), "--peers", "both",
                        "--vllm", str(tmp_path / "v"), "--flashinfer", str(tmp_path / "f")],
                       capture_output=True, text=True, env=checkout_env())
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr


@needs_extract
def test_peers_extract_api_static():
    """The wrapper's signature and the kernel's flush rule the peer maps our experiment onto, read from
    the extract's source (no imports)."""
    tree = ast.parse((EXTRACT / peers_flashinfer._SSU).read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "checkpointing_ssu")
    names = [a.arg for a in fn.args.args]
    assert names[:12] == ["state", "x_cache", "B_cache", "dt_cache", "ring_start", "prev_num_accepted_tokens",
                          "x", "dt", "A", "B", "C", "out"]
    for kw in ("algorithm", "cb_scaled", "cumAdt_vec", "cb_old", "D", "dt_bias", "dt_softplus", "state_scale"):
        assert kw in names
    assert any(isinstance(n, ast.FunctionDef) and n.name == "allocate_checkpointing_ssu_scratch" for n in tree.body)
    csrc = EXTRACT / "flashinfer" / "data" / "csrc"
    for f in ("checkpointing_ssu.cu", "checkpointing_ssu_kernel_inst.cu", "checkpointing_ssu_jit_binding.cu",
              "checkpointing_ssu_customize_config.jinja"):
        assert (csrc / f).is_file(), f
    kernel = EXTRACT / "flashinfer/data/include/flashinfer/mamba/kernel_checkpointing_ssu.cuh"
    if kernel.is_file():  # the full extract (the device pack has no headers)
        src = kernel.read_text()
        assert "bool const must_checkpoint = (prev_k + seq_len > MAX_WINDOW);" in src
        assert "int const write_offset = prev_k;" in src


@needs_extract
def test_peers_extract_loads_behind_stubs():
    for mod in ("torch", "tvm_ffi", "jinja2", "filelock", "pynvml", "tqdm"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} is not installed")
    import inspect

    ssu, scratch, version, jit = peers_flashinfer.load_flashinfer_checkpointing_ssu(EXTRACT)
    assert version == peers_flashinfer.VERSION
    params = list(inspect.signature(ssu).parameters)
    assert params[:12] == ["state", "x_cache", "B_cache", "dt_cache", "ring_start", "prev_num_accepted_tokens",
                           "x", "dt", "A", "B", "C", "out"]
    assert list(inspect.signature(scratch).parameters) == ["batch_size", "num_heads", "num_predicted_tokens",
                                                           "max_window", "dtype", "device"]
    loaded = sorted(n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer."))
    assert "flashinfer.mamba.checkpointing_ssu" in loaded and len(loaded) < 40, loaded
    for name, (G, H, dk, dv) in MAMBA2_SHAPES.items():
        uri = jit["get_uri"](*peers_flashinfer._module_args((G, H, dk, dv), 16))
        assert uri == (f"checkpointing_ssu_s_f32_i_bf16_dt_f32_w_f32_a_f32_si_i32_d_{dv}_ds_{dk}_np_1_mw_16"
                       f"_hpg_{H // G}_ng_{G}")
        aot = jit["env"].FLASHINFER_AOT_DIR / uri / f"{uri}.so"
        failed = peers_flashinfer._unbuildable_marker(jit["env"], uri)
        if failed.is_file():  # FlashInfer's sources reject the shape (headdim 80): nvcc's reasons are kept
            assert not aot.is_file() and "error" in failed.read_text()
            continue
        if not aot.is_file():
            pytest.skip(f"{aot}: not prebuilt")
        assert pathlib.Path(jit["env"].get_aot_path(uri)) == aot


def test_peer_timer_is_checked_before_any_gpu_work():
    """An unknown timer is refused by name before torch or triton load (the device run must not start wrong)."""
    from replayssm_py.peer_timing import TIMERS, time_peer_us
    with pytest.raises(ValueError, match=r"timer must be one of \('events', 'graph'\) \(got 'wall'\)"):
        time_peer_us(lambda: None, "wall")
    assert TIMERS == ("events", "graph")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_peers.py"), "--timer", "wall"],
                       capture_output=True, text=True, env=checkout_env())
    assert r.returncode == 2 and "--timer: invalid choice: 'wall'" in r.stderr, r.stderr
