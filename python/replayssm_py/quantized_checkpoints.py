"""Quantized-weight checkpoints written independently of the C++ loader, in numpy + ml_dtypes: the
oracle of src/model/quantized_weights.cpp (its dequantized weights must equal ours bit for bit).

An FP32 checkpoint becomes

* ``fp8``: block-scaled FP8 E4M3 in the layout of the DeepSeek-V3 / Qwen3 FP8 releases: config.json
  ``quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [br, bc],
  "activation_scheme": "dynamic", "modules_to_not_convert": [...]}``; each quantized Linear has
  ``weight`` F8_E4M3 [out, in] and ``weight_scale_inv`` F32 [ceil(out/br), ceil(in/bc)], block
  (i, j) covering rows [i br, i br + br) and columns [j bc, j bc + bc) (the last ones partial).
  Quantized as transformers' Fp8Quantize does: scale = 448 / amax (1 for an all-zero block),
  codes = e4m3(clip(w * scale, -448, 448)), weight_scale_inv = 1 / scale.
  Dequantized: w = e4m3 * weight_scale_inv.
* ``nvfp4``: NVIDIA TensorRT Model Optimizer's NVFP4 export: config.json ``quantization_config``
  (quant_method "modelopt", quant_algo "NVFP4", config_groups with group_size 16, "ignore") and
  hf_quant_config.json (``{"producer": ..., "quantization": {"quant_algo": "NVFP4",
  "group_size": 16, "exclude_modules": [...]}}``); ``weight`` U8 [out, in/2] (element 2k in the low
  nibble, 2k+1 in the high one), ``weight_scale`` F8_E4M3 [out, in/16], ``weight_scale_2`` F32 [],
  ``input_scale`` F32 []. Quantized with ModelOpt's recipe (NVFP4QTensor): weight_scale_2 =
  amax / (6 * 448), block scale = e4m3(max(block_amax / (6 weight_scale_2), 2^-9)) (1 for an
  all-zero block), codes = e2m1(w / (block scale * weight_scale_2)).
  Dequantized in ModelOpt's order: w = e2m1 * (block scale * weight_scale_2).

All arithmetic is numpy float32 (each operation rounds once). Only decoder-layer matrices
(``*.layers.N.*.weight``, 2-D) are quantized; embeddings and modules matching ``exclude`` (by
default lm_head) stay FP32. ``write_quantized_checkpoint`` also writes, when asked, an FP32
checkpoint holding the dequantized values: `replayssm logits` of both must agree bit for bit.
"""
import fnmatch
import json
import pathlib
import re
import shutil

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

F32 = np.float32
E4M3 = ml_dtypes.float8_e4m3fn
E2M1 = ml_dtypes.float4_e2m1fn
E4M3_MAX = F32(448.0)
E2M1_MAX = F32(6.0)
NVFP4_GROUP = 16
# Float32 value of every E2M1 code 0..15 (sign in bit 3).
E2M1_VALUES = np.arange(16, dtype=np.uint8).view(E2M1).astype(F32)
LAYER_MATRIX = re.compile(r"(^|\.)layers\.\d+\..*\.weight$")


def _blocks(rows, cols, block):
    return -(-rows // block[0]), -(-cols // block[1])


def _expand(grid, rows, cols, block):
    """Per-element copy of a per-block grid: element (r, c) gets grid[r // br, c // bc]."""
    return np.repeat(np.repeat(grid, block[0], axis=0), block[1], axis=1)[:rows, :cols]


def quantize_fp8_block(w, block=(128, 128)):
    """E4M3 codes (ml_dtypes float8_e4m3fn [rows, cols]) and weight_scale_inv (float32 block grid)."""
    w = np.asarray(w, dtype=F32)
    rows, cols = w.shape
    br, bc = _blocks(rows, cols, block)
    padded = np.zeros((br * block[0], bc * block[1]), F32)
    padded[:rows, :cols] = np.abs(w)
    amax = padded.reshape(br, block[0], bc, block[1]).max(axis=(1, 3))
    scale = np.where(amax > 0, E4M3_MAX / np.where(amax > 0, amax, F32(1)), F32(1)).astype(F32)
    scale_inv = (F32(1) / scale).astype(F32)
    codes = np.clip(w * _expand(scale, rows, cols, block), -E4M3_MAX, E4M3_MAX).astype(E4M3)
    return codes, scale_inv


def dequantize_fp8_block(codes, scale_inv, block=(128, 128)):
    rows, cols = codes.shape
    return (codes.astype(F32) * _expand(scale_inv.astype(F32), rows, cols, block)).astype(F32)


def quantize_nvfp4(w):
    """Packed codes (uint8 [rows, cols/2]), block scales (float8_e4m3fn [rows, cols/16]), weight_scale_2."""
    w = np.asarray(w, dtype=F32)
    rows, cols = w.shape
    if cols % NVFP4_GROUP:
        raise ValueError(f"in-dimension {cols} is not a multiple of the NVFP4 group size {NVFP4_GROUP}")
    scale_2 = F32(np.abs(w).max() / F32(6.0 * 448.0))
    groups = w.reshape(rows, cols // NVFP4_GROUP, NVFP4_GROUP)
    block_amax = np.abs(groups).max(axis=2)
    per_block = (block_amax / (F32(6.0) * scale_2)).astype(F32)
    per_block = np.where(per_block == 0, F32(1), per_block)
    scale = np.maximum(per_block, F32(2.0**-9)).astype(E4M3)
    divisor = (scale.astype(F32) * scale_2).astype(F32)
    scaled = (groups / divisor[:, :, None]).astype(F32).reshape(rows, cols)
    codes = np.clip(scaled, -E2M1_MAX, E2M1_MAX).astype(E2M1).view(np.uint8) & np.uint8(0x0F)
    packed = (codes[:, 1::2] << np.uint8(4)) | codes[:, 0::2]
    return packed.astype(np.uint8), scale, scale_2


def dequantize_nvfp4(packed, scale, scale_2):
    rows = packed.shape[0]
    codes = np.empty((rows, packed.shape[1] * 2), np.uint8)
    codes[:, 0::2] = packed & np.uint8(0x0F)
    codes[:, 1::2] = packed >> np.uint8(4)
    block = (scale.astype(F32) * F32(scale_2)).astype(F32)
    return (E2M1_VALUES[codes] * np.repeat(block, NVFP4_GROUP, axis=1)).astype(F32)


def _excluded(module, patterns):
    return any(module == p or module.endswith("." + p) or fnmatch.fnmatchcase(module, p) for p in patterns)


def write_quantized_checkpoint(src, out, fmt, *, block=(128, 128), exclude=("lm_head",), dequantized_out=None,
                               seed=20261212):
    """Writes OUT (config.json [+ hf_quant_config.json] + model.safetensors) from the FP32 checkpoint SRC,
    and, when given, DEQUANTIZED_OUT: SRC's config with FP32 tensors holding the dequantized values.
    Returns {tensor name: dequantized float32 matrix} of the quantized matrices."""
    if fmt not in ("fp8", "nvfp4"):
        raise ValueError(f"format {fmt!r}: expected 'fp8' or 'nvfp4'")
    src, out = pathlib.Path(src), pathlib.Path(out)
    for d in (out, dequantized_out):
        if d is not None and pathlib.Path(d).exists() and any(pathlib.Path(d).iterdir()):
            raise FileExistsError(f"{d}: exists and is not empty (expected a new directory)")
    config = json.loads((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    rng = np.random.default_rng(seed)
    quantized, plain, dequantized = {}, {}, {}
    for name, t in tensors.items():
        if t.dtype != F32:
            raise ValueError(f"{src}: tensor {name} is {t.dtype}, expected float32 (an FP32 golden model)")
        module = name[: -len(".weight")]
        if t.ndim != 2 or not LAYER_MATRIX.search(name) or _excluded(module, exclude):
            plain[name] = t
            continue
        if fmt == "fp8":
            codes, scale_inv = quantize_fp8_block(t, block)
            quantized[name], quantized[name + "_scale_inv"] = codes, scale_inv
            dequantized[name] = dequantize_fp8_block(codes, scale_inv, block)
        else:
            packed, scale, scale_2 = quantize_nvfp4(t)
            quantized[name], quantized[name + "_scale"] = packed, scale
            quantized[name + "_scale_2"] = np.array(scale_2, F32)
            # A static activation scale, as ModelOpt exports it: recorded by the loader, not applied.
            quantized[module + ".input_scale"] = np.array(rng.uniform(0.01, 0.1), F32)
            dequantized[name] = dequantize_nvfp4(packed, scale, scale_2)
    out.mkdir(parents=True, exist_ok=True)
    qconfig = dict(config)
    if fmt == "fp8":
        qconfig["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(block),
                                          "activation_scheme": "dynamic", "modules_to_not_convert": list(exclude)}
    else:
        group = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": NVFP4_GROUP}
        producer = {"name": "modelopt", "version": "replayssm_py.quantized_checkpoints"}
        qconfig["quantization_config"] = {
            "config_groups": {"group_0": {"input_activations": dict(group), "weights": dict(group),
                                          "targets": ["Linear"]}},
            "ignore": list(exclude), "quant_algo": "NVFP4", "producer": producer, "quant_method": "modelopt"}
        (out / "hf_quant_config.json").write_text(json.dumps(
            {"producer": producer, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                                    "group_size": NVFP4_GROUP, "exclude_modules": list(exclude)}},
            indent=2))
    (out / "config.json").write_text(json.dumps(qconfig, indent=2))
    save_file({**plain, **quantized}, str(out / "model.safetensors"))
    if dequantized_out is not None:
        d = pathlib.Path(dequantized_out)
        d.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / "config.json", d / "config.json")
        save_file({**plain, **dequantized}, str(d / "model.safetensors"))
    return dequantized
