// Quantized-weight checkpoints, dequantized to float32 when the weights are read (the forward is
// FP32 throughout), with the element decoders of src/formats. Two published layouts:
//
// FP8 block-scaled ("fp8" in config.json's quantization_config, as in the DeepSeek-V3 and Qwen3
// FP8 releases; {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [br, bc],
// "activation_scheme": "dynamic", "modules_to_not_convert" or "ignored_layers": [...]}):
//   X.weight            F8_E4M3  [out, in]
//   X.weight_scale_inv  F32 (or BF16/F16) [ceil(out/br), ceil(in/bc)]
//   w[r][c] = e4m3(weight[r][c]) * weight_scale_inv[r / br][c / bc]   (one float32 multiply)
// Block (i, j) covers rows [i br, i br + br) and columns [j bc, j bc + bc), the last ones
// partial when out or in is not a multiple: the layout of the scale shape, and of transformers'
// FP8Linear kernels. (transformers 5.17's CPU dequantizer, Fp8Dequantize, instead divides the
// rows evenly by the scale rows, rows / ceil(rows / br): the same blocks whenever out and in are
// multiples of the block size or a single block, which covers the published checkpoints.)
//
// NVFP4 (NVIDIA TensorRT Model Optimizer export: quant_method "modelopt", quant_algo "NVFP4", in
// config.json's quantization_config and/or hf_quant_config.json's "quantization"; group 16;
// excluded modules in "ignore" / "exclude_modules"):
//   X.weight         U8       [out, in/2]  two E2M1 codes per byte, element 2k in the low
//                                          nibble, 2k+1 in the high one (ModelOpt NVFP4QTensor)
//   X.weight_scale   F8_E4M3  [out, in/16] per-16 block scales
//   X.weight_scale_2 F32      [] or [1]    per-tensor scale
//   X.input_scale    F32      [] or [1]    static activation scale: checked and recorded, not
//                                          applied (activations stay FP32 here)
//   w[r][c] = e2m1(code) * (e4m3(weight_scale[r][c / 16]) * weight_scale_2)
// in ModelOpt's own dequantization order (NVFP4QTensor.dequantize: block scale times per-tensor
// scale first, then the element), each product one float32 rounding. transformers 5.17 has no
// loader for these checkpoints (its nvfp4 quantizer refuses pre-quantized weights).
//
// What is quantized is read from the stored dtypes: a weight stored in the quantized dtype is
// dequantized (and must have its scales); a float weight without scales is loaded as stored (the
// excluded modules: lm_head, routers, ...); a float weight that has scales, scales of the wrong
// dtype or shape, and NaN, infinite or negative scales are errors naming file, tensor and
// expectation.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace replayssm::model {

enum class WeightFormat { fp8_block, nvfp4 };
std::string to_string(WeightFormat f);

// The checkpoint's weight quantization, from config.json's quantization_config and/or
// hf_quant_config.json.
struct WeightQuantization {
  std::optional<WeightFormat> format;  // empty: a float checkpoint
  std::string source;                  // where it was read, for messages
  int block_rows = 0, block_cols = 0;  // FP8: weight_block_size
  int group_size = 0;                  // NVFP4: elements per E4M3 block scale (16)
  std::vector<std::string> excluded;   // modules the config says stay unquantized (recorded)
  std::string activation_scheme;       // FP8: "dynamic"; NVFP4: static per-tensor input_scale
  std::string kv_cache_quant_algo;     // NVFP4: e.g. "FP8" (k_scale/v_scale recorded, not applied)

  // Throws std::runtime_error naming the file and field for an unknown quant_method, quant_algo
  // or fmt, an unsupported block or group size, or two config files that disagree.
  static WeightQuantization load(const std::string& model_dir);
};

// One weight matrix that was stored quantized.
struct DequantizedWeight {
  std::string name, file;
  WeightFormat format;
  int64_t rows = 0, cols = 0;
  uint64_t stored_bytes = 0;  // weight and its scales, as stored
};

// Reads quantized weight matrices of a TensorStore (marking weight and scale tensors used).
class QuantizedWeightReader {
 public:
  QuantizedWeightReader(TensorStore& store, WeightQuantization quantization);
  const WeightQuantization& quantization() const { return q_; }
  // Whether the matrix `name` is stored quantized: in the format's dtype, or with scale tensors
  // next to it (then dequantize() names what is wrong).
  bool holds(const std::string& name) const;
  // Validates the weight and its scales against a rows x cols matrix and, unless `shapes_only`,
  // returns its float32 values (row-major).
  std::vector<float> dequantize(const std::string& name, int64_t rows, int64_t cols, bool shapes_only);
  // A float matrix read from a quantized checkpoint (an excluded module), for `info`.
  void note_unquantized(const std::string& name, int64_t rows, int64_t cols);
  // Marks the recorded-only tensors (NVFP4 KV-cache k_scale / v_scale) used; call after the model
  // is built, before TensorStore::check_all_used.
  void finish();

  const std::vector<DequantizedWeight>& dequantized() const { return dequantized_; }
  const std::vector<std::string>& unquantized() const { return unquantized_; }
  uint64_t unquantized_elements() const { return unquantized_elements_; }
  int input_scales() const { return input_scales_; }
  int kv_scales() const { return kv_scales_; }
  // Quantized tensors holding NaN element codes (FP8 E4M3 0x7F/0xFF): loaded as stored, reported.
  const std::vector<NonFiniteTensor>& non_finite() const { return non_finite_; }
  // The `info` lines: formats, counts, tensor names (layer indices folded), memory.
  std::string describe() const;

 private:
  std::vector<float> fp8_block(const std::string& name, int64_t rows, int64_t cols, bool shapes_only);
  std::vector<float> nvfp4(const std::string& name, int64_t rows, int64_t cols, bool shapes_only);

  TensorStore& store_;
  WeightQuantization q_;
  std::vector<DequantizedWeight> dequantized_;
  std::vector<std::string> unquantized_;
  uint64_t unquantized_elements_ = 0;
  int input_scales_ = 0, kv_scales_ = 0;
  std::vector<NonFiniteTensor> non_finite_;
};

}  // namespace replayssm::model
