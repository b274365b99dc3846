"""Quantized-weight checkpoints (issue 12): the C++ loader's dequantized weights equal those of the
independent numpy + ml_dtypes writer (replayssm_py.quantized_checkpoints) bit for bit, seen through
`replayssm logits` of the quantized checkpoint and of an FP32 checkpoint holding the numpy-dequantized
weights; `replayssm info` lists what was dequantized."""
import pathlib
import subprocess

import numpy as np
import pytest

from conftest import replayssm_binary
from replayssm_py import quantized_checkpoints as qc

MODELS = pathlib.Path(__file__).resolve().parents[2] / "data" / "models"
SEED = 20261212


def logprobs(model_dir, tokens, out):
    r = subprocess.run([replayssm_binary(), "logits", str(model_dir), "--tokens", str(tokens), "--out", str(out),
                        "--threads", "1"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.load(out)


# (model, format, FP8 block): [128, 128] is the published block (rows 576 and 776 end in partial
# blocks); [16, 48] also cuts the columns (64 = 48 + 16, 128 = 2 x 48 + 32).
CASES = [("nemotron_h_tiny", "fp8", (128, 128)), ("qwen3_5_tiny", "fp8", (128, 128)),
         ("nemotron_h_tiny", "fp8", (16, 48)), ("qwen3_5_tiny", "fp8", (16, 48)),
         ("nemotron_h_tiny", "nvfp4", None), ("qwen3_5_tiny", "nvfp4", None)]


@pytest.mark.parametrize("model,fmt,block", CASES)
def test_loader_dequantizes_bit_equal_to_numpy(tmp_path, model, fmt, block):
    src = MODELS / model
    deq = qc.write_quantized_checkpoint(src, tmp_path / "q", fmt, block=block or (128, 128),
                                        dequantized_out=tmp_path / "deq")
    assert len(deq) >= 16
    tokens = src / "tokens.npy"
    got = logprobs(tmp_path / "q", tokens, tmp_path / "q.npy")
    want = logprobs(tmp_path / "deq", tokens, tmp_path / "deq.npy")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    # The quantization changed the model (so the comparison above sees the dequantized weights).
    fp32 = np.load(src / "logprobs.npy")
    assert np.abs(got - fp32).max() > 1e-3


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_info_lists_the_dequantized_matrices(tmp_path, fmt):
    qc.write_quantized_checkpoint(MODELS / "nemotron_h_tiny", tmp_path / "q", fmt)
    r = subprocess.run([replayssm_binary(), "info", str(tmp_path / "q")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    name = "FP8 E4M3 block-scaled (blocks 128x128" if fmt == "fp8" else "NVFP4 (ModelOpt"
    assert f"weights        quantized checkpoint: {name}" in r.stdout
    assert "16 matrices dequantized to FP32 (at load" in r.stdout
    assert "backbone.layers.*.mixer.in_proj.weight x2" in r.stdout
    assert "2 matrices stored unquantized" in r.stdout and "lm_head.weight x1" in r.stdout
    assert ("16 input_scale tensors recorded, not applied" in r.stdout) == (fmt == "nvfp4")


def test_writer_nibble_order_and_scales_by_hand():
    # One row of 32: block 0 holds 0.5 at element 0 and 6 at element 1, block 1 holds -3 at element 17
    # (its own amax: scaled to -6).
    w = np.zeros((1, 32), np.float32)
    w[0, 0], w[0, 1], w[0, 17] = 0.5, 6.0, -3.0
    packed, scale, scale_2 = qc.quantize_nvfp4(w)
    assert scale_2 == np.float32(6.0 / 2688.0)
    assert packed[0, 0] == 0x71  # element 0 (0.5: code 1) low nibble, element 1 (6: code 7) high
    assert packed[0, 8] == 0xF0  # element 17 (-6: code 0xF) in the high nibble of byte 8
    assert scale.astype(np.float32).tolist()[0] == [448.0, 224.0]
    np.testing.assert_array_equal(qc.dequantize_nvfp4(packed, scale, scale_2), w)


def test_fp8_writer_matches_transformers_dequantizer_on_whole_blocks():
    # transformers 5.17 Fp8Dequantize (its CPU path) on shapes made of whole blocks or one block.
    torch = pytest.importorskip("torch")
    fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
    rng = np.random.default_rng(SEED)
    for rows, cols in [(256, 384), (96, 64), (384, 128)]:
        w = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        codes, scale_inv = qc.quantize_fp8_block(w)
        ours = qc.dequantize_fp8_block(codes, scale_inv)
        q = torch.from_numpy(codes.view(np.uint8).copy()).view(torch.float8_e4m3fn)
        theirs = fp8.Fp8Dequantize(None)._dequantize_one(q, torch.from_numpy(scale_inv), torch.float32)
        assert np.array_equal(theirs.numpy().view(np.uint32), ours.view(np.uint32)), (rows, cols)


def test_script_writes_a_loadable_checkpoint_and_refuses_an_existing_one(tmp_path):
    script = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "make_quantized_checkpoint.py"
    cmd = ["python3", str(script), str(MODELS / "qwen3_5_tiny"), str(tmp_path / "q"), "--format", "nvfp4"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "38 matrices quantized (nvfp4)" in r.stdout
    r = subprocess.run([replayssm_binary(), "info", str(tmp_path / "q")], capture_output=True, text=True)
    assert r.returncode == 0 and "38 matrices dequantized" in r.stdout, r.stderr
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 2 and "exists and is not empty" in r.stderr


def read_safetensors_raw(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, read as the format defines it (8-byte
    little-endian header length, JSON header, data): any dtype, no library."""
    import json
    import struct
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def write_safetensors_raw(path, tensors):
    import json
    import struct
    header, offset = {}, 0
    for k, (dtype, shape, b) in tensors.items():
        header[k] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(b for _, _, b in tensors.values()))


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_sharded_quantized_checkpoint_loads_like_one_file(tmp_path, fmt):
    """A quantized checkpoint split over two shards with model.safetensors.index.json (weights and their
    scales in different shards, as a large release may have them) gives the same bits as one file."""
    import json
    src = MODELS / "qwen3_5_tiny"
    qc.write_quantized_checkpoint(src, tmp_path / "q", fmt)
    shard = tmp_path / "sharded"
    shard.mkdir()
    for f in (tmp_path / "q").iterdir():
        if f.name != "model.safetensors":
            (shard / f.name).write_bytes(f.read_bytes())
    tensors = read_safetensors_raw(tmp_path / "q" / "model.safetensors")
    names = sorted(tensors)
    # Alternate names between the shards, so a weight and its scale usually land in different files.
    parts = {"model-00001-of-00002.safetensors": names[0::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, part in parts.items():
        write_safetensors_raw(shard / file, {n: tensors[n] for n in part})
        weight_map.update({n: file for n in part})
    split = [n for n in names if n.endswith(".weight") and any(
        weight_map.get(n[:-len(".weight")] + s, weight_map[n]) != weight_map[n]
        for s in (".weight_scale_inv", ".weight_scale"))]
    assert split  # some weight and its scale sit in different shards
    (shard / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    tokens = src / "tokens.npy"
    one = logprobs(tmp_path / "q", tokens, tmp_path / "one.npy")
    two = logprobs(shard, tokens, tmp_path / "two.npy")
    assert np.array_equal(one.view(np.uint32), two.view(np.uint32))
