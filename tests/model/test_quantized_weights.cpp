// Quantized-weight checkpoints (model/quantized_weights.h): dequantized values of hand-made FP8
// block-scaled and NVFP4 tensors (nibble order, block edges, scale order), and every bad input
// refused with the file, the tensor or field and the expectation. The bit-exact comparison with
// the independent numpy writer is tests/python/test_quantized_checkpoints.py.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "model/quantized_weights.h"
#include "test_model_util.h"

using namespace replayssm;
using namespace replayssm::test;
namespace fs = std::filesystem;

namespace {

RawTensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values) {
  RawTensor t{"F32", std::move(shape), std::string(values.size() * 4, '\0')};
  std::memcpy(t.bytes.data(), values.data(), t.bytes.size());
  return t;
}
RawTensor byte_tensor(const std::string& dtype, std::vector<int64_t> shape, const std::vector<uint8_t>& bytes) {
  return RawTensor{dtype, std::move(shape), std::string(bytes.begin(), bytes.end())};
}
RawTensor filled(const std::string& dtype, std::vector<int64_t> shape, uint8_t byte, int bytes_per_element = 1) {
  int64_t n = bytes_per_element;
  for (int64_t d : shape) n *= d;
  return RawTensor{dtype, std::move(shape), std::string(static_cast<std::size_t>(n), static_cast<char>(byte))};
}

const nlohmann::json kFp8Config = {{"quant_method", "fp8"},
                                   {"fmt", "e4m3"},
                                   {"weight_block_size", {128, 128}},
                                   {"activation_scheme", "dynamic"},
                                   {"modules_to_not_convert", {"lm_head"}}};
const nlohmann::json kNvfp4Config = {{"quant_method", "modelopt"}, {"quant_algo", "NVFP4"}, {"ignore", {"lm_head"}}};

// A directory holding config.json (with `quantization_config` unless null) and `tensors`.
void write_dir(const fs::path& dir, const RawTensors& tensors, const nlohmann::json& quantization_config) {
  fs::create_directories(dir);
  nlohmann::json config = {{"model_type", "qwen3_5_text"}};
  if (!quantization_config.is_null()) config["quantization_config"] = quantization_config;
  spit(dir / "config.json", config.dump());
  write_safetensors_raw(dir / "model.safetensors", tensors);
}

// The values the reader gives for tensor `name` (rows x cols) of the checkpoint in dir.
std::vector<float> dequantized(const fs::path& dir, const std::string& name, int64_t rows, int64_t cols) {
  model::TensorStore store(dir.string());
  model::QuantizedWeightReader reader(store, model::WeightQuantization::load(dir.string()));
  REQUIRE(reader.holds(name));
  return reader.dequantize(name, rows, cols, false);
}

// qwen3_5_tiny with its layer-0 down_proj [64, 96] quantized (every code and scale valid), after `edit`.
const char* const kDown = "model.layers.0.mlp.down_proj.weight";
fs::path quantized_golden(const TempDir& tmp, const std::string& format,
                          const std::function<void(RawTensors&, nlohmann::json&)>& edit = {}) {
  const fs::path dir = tmp.path() / format;
  copy_model("qwen3_5_tiny", dir);
  RawTensors t = read_safetensors_raw(dir / "model.safetensors");
  const std::string d = kDown;
  nlohmann::json qc;
  if (format == "fp8") {
    t[d] = filled("F8_E4M3", {64, 96}, 0x38);  // 1.0
    t[d + "_scale_inv"] = f32_tensor({1, 1}, {0.01f});
    qc = kFp8Config;
  } else {
    t[d] = filled("U8", {64, 48}, 0x21);          // elements 1.0 (code 2) and 0.5 (code 1)
    t[d + "_scale"] = filled("F8_E4M3", {64, 6}, 0x38);
    t[d + "_scale_2"] = f32_tensor({}, {0.01f});
    t["model.layers.0.mlp.down_proj.input_scale"] = f32_tensor({}, {0.05f});
    qc = kNvfp4Config;
  }
  if (edit) edit(t, qc);
  write_safetensors_raw(dir / "model.safetensors", t);
  edit_config(dir, [&](nlohmann::json& j) {
    if (!qc.is_null()) j["quantization_config"] = qc;
  });
  return dir;
}

void check_error(const std::string& message, const std::vector<std::string>& parts) {
  INFO(message);
  for (const std::string& p : parts) CHECK(contains(message, p));
}

}  // namespace

TEST_CASE("FP8 block-scaled: each element is its code times the scale of its block, edges partial") {
  TempDir tmp("qw_fp8_values");
  // 3 x 5 with blocks 2 x 2: scale grid 2 x 3, the last block row and column partial.
  const std::vector<uint8_t> codes = {0x38, 0x38, 0x40, 0xB8, 0x01,  // 1, 1, 2, -1, 2^-9
                                      0x38, 0x38, 0x38, 0x38, 0x38,  //
                                      0x40, 0x38, 0x38, 0x38, 0xC0};  // 2, ..., -2
  const std::vector<float> scales = {1.0f, 0.5f, 0.25f, 4.0f, 8.0f, 16.0f};
  nlohmann::json qc = kFp8Config;
  qc["weight_block_size"] = {2, 2};
  write_dir(tmp.path(), {{"w.weight", byte_tensor("F8_E4M3", {3, 5}, codes)},
                         {"w.weight_scale_inv", f32_tensor({2, 3}, scales)}}, qc);
  const std::vector<float> w = dequantized(tmp.path(), "w.weight", 3, 5);
  const std::vector<float> expected = {1.0f, 1.0f,  1.0f, -0.5f, 0.25f * 0x1p-9f,  //
                                       1.0f, 1.0f,  0.5f, 0.5f,  0.25f,             //
                                       8.0f, 4.0f,  8.0f, 8.0f,  -32.0f};
  CHECK(w == expected);
}

TEST_CASE("NVFP4: element 2k is the low nibble; value = e2m1 * (block scale * weight_scale_2)") {
  TempDir tmp("qw_nvfp4_values");
  std::vector<uint8_t> packed(16, 0x00);
  packed[0] = 0x71;  // element 0: code 1 (0.5), element 1: code 7 (6)
  packed[8] = 0xF0;  // element 16: 0, element 17: code 0xF (-6)
  write_dir(tmp.path(), {{"w.weight", byte_tensor("U8", {1, 16}, packed)},
                         {"w.weight_scale", byte_tensor("F8_E4M3", {1, 2}, {0x38, 0x40})},  // 1, 2
                         {"w.weight_scale_2", f32_tensor({}, {0.5f})}}, kNvfp4Config);
  const std::vector<float> w = dequantized(tmp.path(), "w.weight", 1, 32);
  std::vector<float> expected(32, 0.0f);
  expected[0] = 0.25f, expected[1] = 3.0f, expected[17] = -6.0f;
  CHECK(w == expected);

  // The order of the products is ModelOpt's: for this s2, 3 * (0.75 * s2) and (3 * 0.75) * s2 round
  // to different floats, and the loader gives the first.
  TempDir tmp2("qw_nvfp4_order");
  float s2;
  const uint32_t s2_bits = 1008485535u;  // 0.0095378449...
  std::memcpy(&s2, &s2_bits, 4);
  const float block_first = 3.0f * (0.75f * s2), element_first = (3.0f * 0.75f) * s2;
  REQUIRE(block_first != element_first);
  write_dir(tmp2.path(), {{"w.weight", byte_tensor("U8", {1, 8}, {0x05, 0, 0, 0, 0, 0, 0, 0})},  // 3.0
                          {"w.weight_scale", byte_tensor("F8_E4M3", {1, 1}, {0x34})},            // 0.75
                          {"w.weight_scale_2", f32_tensor({1}, {s2})}}, kNvfp4Config);
  CHECK(dequantized(tmp2.path(), "w.weight", 1, 16)[0] == block_first);
}

TEST_CASE("quantized checkpoints of a golden model load; info lists the dequantized matrix") {
  TempDir tmp("qw_golden");
  for (const std::string format : {"fp8", "nvfp4"}) {
    CAPTURE(format);
    const fs::path dir = quantized_golden(tmp, format);
    CHECK(load_error(dir) == "(no error)");
    const model::CausalLM lm = model::CausalLM::load(dir.string());
    REQUIRE(lm.dequantized_weights().size() == 1);
    CHECK(lm.dequantized_weights()[0].name == kDown);
    const std::string info = model::CausalLM::inspect(dir.string()).describe();
    CHECK(contains(info, "1 matrices dequantized to FP32 (at load"));
    CHECK(contains(info, "model.layers.*.mlp.down_proj.weight x1"));
    CHECK(contains(info, format == "fp8" ? "FP8 E4M3 block-scaled (blocks 128x128" : "NVFP4 (ModelOpt"));
  }
}

TEST_CASE("quantization configs: unknown method, algorithm, fmt, block or group size are refused") {
  TempDir tmp("qw_config");
  auto with = [&](const std::string& format, const std::function<void(nlohmann::json&)>& edit) {
    return load_error(quantized_golden(tmp, format, [&](RawTensors&, nlohmann::json& qc) { edit(qc); }));
  };
  check_error(with("fp8", [](auto& q) { q["quant_method"] = "gptq"; }),
              {"config.json: quantization_config", "unknown \"quant_method\" 'gptq'", "expected \"fp8\""});
  check_error(with("fp8", [](auto& q) { q.erase("quant_method"); }),
              {"config.json: quantization_config", "missing \"quant_method\""});
  check_error(with("nvfp4", [](auto& q) { q["quant_algo"] = "FP8_PB_WO"; }),
              {"config.json: quantization_config", "\"quant_algo\" is 'FP8_PB_WO', expected \"NVFP4\""});
  check_error(with("fp8", [](auto& q) { q["fmt"] = "e5m2"; }), {"\"fmt\" is 'e5m2', expected \"e4m3\""});
  check_error(with("fp8", [](auto& q) { q["weight_block_size"] = {128}; }),
              {"\"weight_block_size\" is [128], expected [rows, cols], two positive integers"});
  check_error(with("fp8", [](auto& q) { q["weight_block_size"] = {0, 128}; }),
              {"\"weight_block_size\" is 0, expected [rows, cols], two positive integers"});
  check_error(with("fp8", [](auto& q) { q.erase("weight_block_size"); }),
              {"missing \"weight_block_size\"", "per-tensor FP8 scales are not supported"});
  check_error(with("fp8", [](auto& q) { q["activation_scheme"] = "static"; }),
              {"\"activation_scheme\" is 'static', expected \"dynamic\""});
  check_error(with("fp8", [](auto& q) { q["scale_fmt"] = "ue8m0"; }), {"\"scale_fmt\" is 'ue8m0', expected \"float\""});
  check_error(with("nvfp4", [](auto& q) { q["group_size"] = 32; }),
              {"\"group_size\" is 32, expected 16 (NVFP4's block"});
  check_error(with("nvfp4",
                   [](auto& q) {
                     q["config_groups"] = {{"group_0", {{"weights", {{"num_bits", 4}, {"group_size", 8}}}}}};
                   }),
              {"\"config_groups.group_0.weights.group_size\" is 8, expected 16"});
  check_error(with("fp8", [](auto& q) { q = "fp8"; }), {"\"quantization_config\" is not an object"});
}

TEST_CASE("hf_quant_config.json: read alone, must agree with config.json") {
  TempDir tmp("qw_hfq");
  const fs::path dir = quantized_golden(tmp, "nvfp4", [](RawTensors&, nlohmann::json& qc) { qc = nullptr; });
  const nlohmann::json hq = {{"producer", {{"name", "modelopt"}}},
                             {"quantization", {{"quant_algo", "NVFP4"}, {"group_size", 16}, {"exclude_modules", {"lm_head"}}}}};
  spit(dir / "hf_quant_config.json", hq.dump());
  CHECK(load_error(dir) == "(no error)");
  CHECK(contains(model::CausalLM::inspect(dir.string()).describe(), "hf_quant_config.json: quantization"));
  nlohmann::json bad = hq;
  bad["quantization"]["quant_algo"] = "W4A8_AWQ";
  spit(dir / "hf_quant_config.json", bad.dump());
  check_error(load_error(dir), {"hf_quant_config.json: quantization", "\"quant_algo\" is 'W4A8_AWQ', expected \"NVFP4\""});
  spit(dir / "hf_quant_config.json", "{\"producer\": {}}");
  check_error(load_error(dir), {"hf_quant_config.json", "missing \"quantization\" object"});
  // config.json says FP8, hf_quant_config.json says ModelOpt: which one is meant?
  spit(dir / "hf_quant_config.json", hq.dump());
  edit_config(dir, [](nlohmann::json& j) { j["quantization_config"] = kFp8Config; });
  check_error(load_error(dir), {"quant_method is \"fp8\" but", "hf_quant_config.json describes a ModelOpt"});
}

TEST_CASE("FP8 block-scaled tensors: missing or misshapen scales, wrong dtypes, NaN scales are refused") {
  TempDir tmp("qw_fp8_bad");
  const std::string d = kDown;
  auto with = [&](const std::function<void(RawTensors&)>& edit) {
    return load_error(quantized_golden(tmp, "fp8", [&](RawTensors& t, nlohmann::json&) { edit(t); }));
  };
  check_error(with([&](auto& t) { t[d + "_scale_inv"] = f32_tensor({2, 1}, {1, 1}); }),
              {"model.safetensors", "tensor '" + d + "_scale_inv' has shape [2, 1], expected [1, 1]",
               "weight_block_size [128, 128]"});
  check_error(with([&](auto& t) { t.erase(d + "_scale_inv"); }),
              {"model.safetensors", "missing tensor '" + d + "_scale_inv'", "expected F32 [1, 1]"});
  check_error(with([&](auto& t) { t[d] = filled("F16", {64, 96}, 0x3C, 2); }),
              {"model.safetensors", "tensor '" + d + "' has dtype F16, expected F8_E4M3"});
  check_error(with([&](auto& t) { t[d + "_scale_inv"] = filled("I32", {1, 1}, 1, 4); }),
              {"tensor '" + d + "_scale_inv' has dtype I32, expected F32"});
  check_error(with([&](auto& t) { t[d] = filled("F8_E4M3", {96, 64}, 0x38); }),
              {"tensor '" + d + "' has shape [96, 64], expected [64, 96]"});
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), -0.5f}) {
    CAPTURE(bad);
    check_error(with([&](auto& t) { t[d + "_scale_inv"] = f32_tensor({1, 1}, {bad}); }),
                {"model.safetensors", "tensor '" + d + "_scale_inv' block [0, 0]",
                 "expected a finite, non-negative scale"});
  }
  // A scale next to a tensor the model does not read as a matrix is not silently dropped.
  check_error(with([&](auto& t) { t["model.layers.0.linear_attn.conv1d.weight_scale_inv"] = f32_tensor({1, 1}, {1}); }),
              {"unexpected tensor", "conv1d.weight_scale_inv"});
  // NaN element codes load as stored and are reported, as NaN float weights are.
  const fs::path nan_dir = quantized_golden(tmp, "fp8", [&](RawTensors& t, nlohmann::json&) { t[d].bytes[5] = 0x7F; });
  CHECK(load_error(nan_dir) == "(no error)");
  const auto non_finite = model::CausalLM::inspect(nan_dir.string()).non_finite_weights();
  REQUIRE(non_finite.size() == 1);
  CHECK(non_finite[0].name == d);
  CHECK(non_finite[0].count == 1);
}

TEST_CASE("NVFP4 tensors: missing scales, wrong dtypes and shapes, NaN or negative scales are refused") {
  TempDir tmp("qw_nvfp4_bad");
  const std::string d = kDown, base = "model.layers.0.mlp.down_proj.";
  auto with = [&](const std::function<void(RawTensors&)>& edit) {
    return load_error(quantized_golden(tmp, "nvfp4", [&](RawTensors& t, nlohmann::json&) { edit(t); }));
  };
  check_error(with([&](auto& t) { t.erase(d + "_scale"); }),
              {"missing tensor '" + d + "_scale'", "expected F8_E4M3 [64, 6]", "per-16 E4M3 block scales"});
  check_error(with([&](auto& t) { t.erase(d + "_scale_2"); }),
              {"missing tensor '" + d + "_scale_2'", "expected F32 []", "FP32 per-tensor scale"});
  check_error(with([&](auto& t) { t[d + "_scale"] = filled("F16", {64, 6}, 0x3C, 2); }),
              {"model.safetensors", "tensor '" + d + "_scale' has dtype F16, expected F8_E4M3"});
  check_error(with([&](auto& t) { t[d + "_scale"] = filled("F8_E4M3", {64, 3}, 0x38); }),
              {"tensor '" + d + "_scale' has shape [64, 3], expected [64, 6]"});
  check_error(with([&](auto& t) { t[d + "_scale_2"] = f32_tensor({2}, {1, 1}); }),
              {"tensor '" + d + "_scale_2' has shape [2], expected []"});
  check_error(with([&](auto& t) { t[d] = filled("U8", {64, 96}, 0x11); }),
              {"tensor '" + d + "' has shape [64, 96], expected [64, 48] (the [64, 96] matrix, two E2M1 codes per byte)"});
  check_error(with([&](auto& t) { t[d] = filled("F32", {64, 96}, 0, 4); }),
              {"tensor '" + d + "' has dtype F32, expected U8 (two E2M1 codes per byte"});
  check_error(with([&](auto& t) { t[d + "_scale"].bytes[7] = static_cast<char>(0x7F); }),
              {"tensor '" + d + "_scale' block [1, 1] holds E4M3 code 0x7F (nan)", "expected a finite, non-negative"});
  check_error(with([&](auto& t) { t[d + "_scale"].bytes[0] = static_cast<char>(0xB8); }),
              {"tensor '" + d + "_scale' block [0, 0] holds E4M3 code 0xB8 (-1)"});
  check_error(with([&](auto& t) { t[d + "_scale_2"] = f32_tensor({}, {std::nanf("")}); }),
              {"tensor '" + d + "_scale_2' holds nan, expected a finite, non-negative scale"});
  check_error(with([&](auto& t) { t[base + "input_scale"] = f32_tensor({}, {-1.0f}); }),
              {"tensor '" + base + "input_scale' holds -1, expected a finite, positive scale"});
  check_error(with([&](auto& t) { t[base + "input_scale"] = filled("BF16", {}, 0, 2); }),
              {"tensor '" + base + "input_scale' has dtype BF16, expected F32"});
}

TEST_CASE("NVFP4: an in-dimension that is odd or not a multiple of 16 is refused") {
  TempDir tmp("qw_nvfp4_odd");
  for (const int cols : {33, 40}) {
    CAPTURE(cols);
    const fs::path dir = tmp.path() / std::to_string(cols);
    write_dir(dir, {{"w.weight", filled("U8", {2, cols / 2}, 0)},
                    {"w.weight_scale", filled("F8_E4M3", {2, 2}, 0x38)},
                    {"w.weight_scale_2", f32_tensor({}, {1.0f})}}, kNvfp4Config);
    const std::string e = error_of([&] { (void)dequantized(dir, "w.weight", 2, cols); });
    check_error(e, {"model.safetensors", "tensor 'w.weight'", fmt::format("matrix is [2, {}]", cols),
                    "a multiple of the", "group size 16"});
    CHECK(contains(e, "odd in-dimension") == (cols % 2 == 1));
  }
}

TEST_CASE("a quantized dtype in a checkpoint without a quantization config names the missing config") {
  TempDir tmp("qw_noconfig");
  const fs::path dir = quantized_golden(tmp, "fp8", [](RawTensors&, nlohmann::json& qc) { qc = nullptr; });
  check_error(load_error(dir), {"model.safetensors", std::string("tensor '") + kDown + "' has dtype F8_E4M3",
                                "needs a quantization config"});
}

TEST_CASE("NVFP4 with an FP8 KV cache: k_scale / v_scale are recorded, not applied; a bad one is refused") {
  TempDir tmp("qw_kv");
  const std::string k = "model.layers.3.self_attn.k_proj.k_scale";
  auto dir_with = [&](const RawTensor& scale) {
    return quantized_golden(tmp, "nvfp4", [&](RawTensors& t, nlohmann::json& qc) {
      qc["kv_cache_scheme"] = {{"dynamic", false}, {"num_bits", 8}, {"type", "float"}};
      t[k] = scale;
    });
  };
  const fs::path good = dir_with(f32_tensor({}, {0.02f}));
  CHECK(load_error(good) == "(no error)");
  CHECK(contains(model::CausalLM::inspect(good.string()).describe(), "KV cache: FP8 1 k_scale/v_scale tensors recorded"));
  check_error(load_error(dir_with(f32_tensor({2}, {1, 1}))),
              {"model.safetensors", "tensor '" + k + "' has dtype F32 shape [2], expected F32 []"});
  // Without the KV-cache entry in the config the scale is an unexpected tensor.
  const fs::path no_kv = quantized_golden(tmp, "nvfp4", [&](RawTensors& t, nlohmann::json&) { t[k] = f32_tensor({}, {1}); });
  check_error(load_error(no_kv), {"unexpected tensor", k});
}
