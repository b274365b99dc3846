// Loading checkpoints: every bad input gives an error naming the file, the tensor (or key) and
// what was expected; BF16/F16 and sharded checkpoints load to the same model.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "formats/element_formats.h"
#include "model/causal_lm.h"
#include "model/json_util.h"
#include "model/safetensors.h"
#include "test_model_util.h"

using namespace replayssm;
using namespace replayssm::model;
using namespace replayssm::test;
namespace fs = std::filesystem;

namespace {

Mat fp32_logprobs(const std::string& dir, const std::vector<int64_t>& tokens) {
  ForwardOptions o;
  o.threads = 2;
  return CausalLM::load(dir).log_probs(tokens, ssm::PrecisionPolicy::parse("conv:fp32"), o);
}

uint16_t to_bf16_rne(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}

}  // namespace

TEST_CASE("safetensors header validation names file, tensor and expectation") {
  TempDir tmp;
  const fs::path src = fs::path(golden_dir("mamba2_tiny")) / "model.safetensors";
  const RawTensors raw = read_safetensors_raw(src);
  const std::string good = slurp(src);
  const std::string victim = "backbone.layers.1.mixer.D";
  const fs::path f = tmp.path() / "model.safetensors";

  SUBCASE("truncated data region") {
    spit(f, good.substr(0, good.size() - 100));
    const std::string e = error_of([&] { SafetensorsFile s(f.string()); });
    CHECK(e.find(f.string()) != std::string::npos);
    CHECK(e.find("truncated") != std::string::npos);
    CHECK(e.find("reach past the end of the data region") != std::string::npos);
  }
  SUBCASE("truncated header") {
    spit(f, good.substr(0, 100));
    const std::string e = error_of([&] { SafetensorsFile s(f.string()); });
    CHECK(e.find(f.string()) != std::string::npos);
    CHECK(e.find("truncated safetensors file: header length says") != std::string::npos);
  }
  SUBCASE("shorter than the length prefix") {
    spit(f, good.substr(0, 5));
    CHECK(error_of([&] { SafetensorsFile s(f.string()); }).find("expected at least 8") != std::string::npos);
  }
  SUBCASE("header is not JSON") {
    std::string bad = good;
    bad[8] = '#';
    CHECK(error_of([&] { SafetensorsFile s(f.string()); }).find("cannot open") != std::string::npos);
    spit(f, bad);
    CHECK(error_of([&] { SafetensorsFile s(f.string()); }).find("not valid JSON") != std::string::npos);
  }
  SUBCASE("offsets inconsistent with dtype and shape") {
    nlohmann::json h = safetensors_header(raw);
    h[victim]["data_offsets"][1] = h[victim]["data_offsets"][1].get<uint64_t>() - 4;
    spit(f, safetensors_bytes(h, raw));
    const std::string e = error_of([&] { SafetensorsFile s(f.string()); });
    CHECK(e.find(f.string()) != std::string::npos);
    CHECK(e.find("tensor '" + victim + "'") != std::string::npos);
    CHECK(e.find("dtype F32 shape [8] needs 32 bytes") != std::string::npos);
    CHECK(e.find("header lies about offsets") != std::string::npos);
  }
  SUBCASE("overlapping tensors") {
    nlohmann::json h = safetensors_header(raw);
    h[victim]["data_offsets"] = h["backbone.layers.1.mixer.A_log"]["data_offsets"];
    spit(f, safetensors_bytes(h, raw));
    const std::string e = error_of([&] { SafetensorsFile s(f.string()); });
    CHECK(e.find("overlap") != std::string::npos);
    CHECK(e.find(victim) != std::string::npos);
  }
  SUBCASE("offsets past the end of the file") {
    nlohmann::json h = safetensors_header(raw);
    h[victim]["data_offsets"] = {good.size(), good.size() + 32};
    spit(f, safetensors_bytes(h, raw));
    const std::string e = error_of([&] { SafetensorsFile s(f.string()); });
    CHECK(e.find("tensor '" + victim + "'") != std::string::npos);
    CHECK(e.find("reach past the end of the data region") != std::string::npos);
  }
  SUBCASE("unknown dtype and bad shape entries") {
    nlohmann::json h = safetensors_header(raw);
    h[victim]["dtype"] = "F13";
    spit(f, safetensors_bytes(h, raw));
    CHECK(error_of([&] { SafetensorsFile s(f.string()); }).find("unknown dtype 'F13'") != std::string::npos);
    h = safetensors_header(raw);
    h[victim]["shape"] = {-8};
    spit(f, safetensors_bytes(h, raw));
    CHECK(error_of([&] { SafetensorsFile s(f.string()); }).find("negative") != std::string::npos);
    h = safetensors_header(raw);
    h[victim].erase("data_offsets");
    spit(f, safetensors_bytes(h, raw));
    CHECK(error_of([&] { SafetensorsFile s(f.string()); }).find("missing \"data_offsets\"") != std::string::npos);
  }
  SUBCASE("implausible header length") {
    std::string bad = good;
    const uint64_t n = uint64_t{1} << 40;
    std::memcpy(bad.data(), &n, 8);
    spit(f, bad);
    CHECK(error_of([&] { SafetensorsFile s(f.string()); }).find("implausible") != std::string::npos);
  }
}

TEST_CASE("checkpoint/model mismatches name file, tensor and expectation") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("mamba2_tiny", dir);
  const fs::path st = dir / "model.safetensors";
  RawTensors raw = read_safetensors_raw(st);

  SUBCASE("missing tensor") {
    raw.erase("backbone.layers.2.mixer.dt_bias");
    write_safetensors_raw(st, raw);
    const std::string e = load_error(dir);
    CHECK(e.find(st.string()) != std::string::npos);
    CHECK(e.find("missing tensor 'backbone.layers.2.mixer.dt_bias' (expected shape [8])") != std::string::npos);
  }
  SUBCASE("missing LM head of an untied model") {
    raw.erase("lm_head.weight");
    write_safetensors_raw(st, raw);
    CHECK(load_error(dir).find("missing tensor 'lm_head.weight' (expected shape [256, 64])") != std::string::npos);
  }
  SUBCASE("extra tensor") {
    raw["backbone.layers.0.mixer.surprise"] = RawTensor{"F32", {2}, std::string(8, '\0')};
    write_safetensors_raw(st, raw);
    const std::string e = load_error(dir);
    CHECK(e.find("unexpected tensor") != std::string::npos);
    CHECK(e.find("'backbone.layers.0.mixer.surprise' in " + st.string()) != std::string::npos);
  }
  SUBCASE("shape mismatch") {
    raw["backbone.layers.0.mixer.out_proj.weight"].shape = {128, 64};
    write_safetensors_raw(st, raw);
    const std::string e = load_error(dir);
    CHECK(e.find(st.string() +
                 ": tensor 'backbone.layers.0.mixer.out_proj.weight' has shape [128, 64], expected [64, 128]") !=
          std::string::npos);
  }
  SUBCASE("dtype mismatch") {
    RawTensor& t = raw["backbone.layers.0.mixer.A_log"];
    t.dtype = "I64";
    t.bytes += t.bytes;  // 8 bytes per element
    write_safetensors_raw(st, raw);
    const std::string e = load_error(dir);
    CHECK(e.find("tensor 'backbone.layers.0.mixer.A_log' has dtype I64, expected F32, BF16 or F16") !=
          std::string::npos);
    CHECK(e.find(st.string()) != std::string::npos);
  }
  SUBCASE("no weights at all") {
    fs::remove(st);
    CHECK(load_error(dir).find("no model.safetensors or model.safetensors.index.json") != std::string::npos);
  }
}

TEST_CASE("config errors name the file and the key") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  const std::string cfg = (dir / "config.json").string();

  SUBCASE("unknown model_type") {
    copy_model("mamba2_tiny", dir);
    edit_config(dir, [](nlohmann::json& j) { j["model_type"] = "llama"; });
    const std::string e = load_error(dir);
    CHECK(e.find(cfg) != std::string::npos);
    CHECK(e.find("unknown model_type \"llama\" (supported: mamba2, nemotron_h, qwen3_5, qwen3_5_text, qwen3_5_moe, "
                "qwen3_5_moe_text, kimi_linear)") != std::string::npos);
  }
  SUBCASE("missing key") {
    copy_model("mamba2_tiny", dir);
    edit_config(dir, [](nlohmann::json& j) { j.erase("num_heads"); });
    CHECK(load_error(dir).find(cfg + ": missing config key \"num_heads\" (expected an integer)") != std::string::npos);
  }
  SUBCASE("ill-typed key") {
    copy_model("qwen3_5_tiny", dir);
    edit_config(dir, [](nlohmann::json& j) { j["linear_key_head_dim"] = "wide"; });
    CHECK(load_error(dir).find("config key \"linear_key_head_dim\" is \"wide\", expected an integer") !=
          std::string::npos);
  }
  SUBCASE("inconsistent shapes") {
    copy_model("mamba2_tiny", dir);
    edit_config(dir, [](nlohmann::json& j) { j["expand"] = 3; });
    CHECK(load_error(dir).find("must equal num_heads * head_dim") != std::string::npos);
  }
  SUBCASE("MoE layer in a Nemotron-H pattern without its experts") {
    copy_model("nemotron_h_tiny", dir);
    edit_config(dir, [](nlohmann::json& j) {
      j["layers_block_type"][2] = "moe";
      j["n_routed_experts"] = 4;
      j["num_experts_per_tok"] = 2;
      j["moe_intermediate_size"] = 32;
      j["moe_shared_expert_intermediate_size"] = 32;
      j["n_group"] = 1;
      j["topk_group"] = 1;
    });
    const std::string e = load_error(dir);
    CHECK(e.find("missing tensor 'model.layers.2.mixer.gate.weight'") != std::string::npos);
  }
  SUBCASE("not a directory, no config") {
    CHECK(load_error(tmp.path() / "nothing").find("not a model directory") != std::string::npos);
    fs::create_directories(dir);
    CHECK(load_error(dir).find("missing config.json") != std::string::npos);
    spit(dir / "config.json", "{\"model_type\": ");
    CHECK(load_error(dir).find(cfg + ": not valid JSON") != std::string::npos);
  }
}

TEST_CASE("legacy spellings: hybrid_override_pattern, backbone. prefix, Python Infinity literals") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("nemotron_h_tiny", dir);
  std::string cfg = slurp(dir / "config.json");
  edit_config(dir, [](nlohmann::json& j) {
    j.erase("layers_block_type");
    j["hybrid_override_pattern"] = "M*-M-*";
  });
  // Python's json writes inf as a bare Infinity.
  cfg = slurp(dir / "config.json");
  const auto pos = cfg.find("\"time_step_limit\"");
  REQUIRE(pos != std::string::npos);
  const auto end = cfg.find(']', pos);
  cfg.replace(pos, end - pos + 1, "\"time_step_limit\": [0.0, Infinity]");
  spit(dir / "config.json", cfg);
  const auto tokens = read_tokens(golden_dir("nemotron_h_tiny") + "/tokens.npy");
  const Mat a = fp32_logprobs(dir.string(), tokens), b = fp32_logprobs(golden_dir("nemotron_h_tiny"), tokens);
  CHECK((a.array() == b.array()).all());
  CHECK(CausalLM::inspect(dir.string()).config().pattern() == "M*-M-*");
}

TEST_CASE("BF16 and F16 checkpoints convert exactly; sharded checkpoints load identically") {
  TempDir tmp;
  const std::string name = "qwen3_5_tiny";
  const auto tokens = read_tokens(golden_dir(name) + "/tokens.npy");
  const RawTensors raw = read_safetensors_raw(fs::path(golden_dir(name)) / "model.safetensors");

  // BF16: round every weight to bf16, write it as F32 (reference) and as BF16 (under test).
  RawTensors as_f32 = raw, as_bf16 = raw;
  for (auto& [n, t] : as_f32) {
    std::vector<float> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    std::string b16(v.size() * 2, '\0');
    for (std::size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = to_bf16_rne(v[i]);
      std::memcpy(b16.data() + 2 * i, &h, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      std::memcpy(&v[i], &bits, 4);
    }
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    as_bf16[n].dtype = "BF16";
    as_bf16[n].bytes = b16;
  }
  const fs::path d32 = tmp.path() / "f32", d16 = tmp.path() / "bf16";
  copy_model(name, d32);
  copy_model(name, d16);
  write_safetensors_raw(d32 / "model.safetensors", as_f32);
  write_safetensors_raw(d16 / "model.safetensors", as_bf16);
  const Mat ref = fp32_logprobs(d32.string(), tokens);
  CHECK((fp32_logprobs(d16.string(), tokens).array() == ref.array()).all());

  // F16 of the bf16-rounded weights is exact for values in F16's range (all weights here are);
  // use a few tensors to keep it simple: norms and A_log.
  RawTensors as_f16 = as_f32;
  int converted = 0;
  for (auto& [n, t] : as_f16) {
    if (t.shape.size() != 1) continue;
    std::vector<float> v(t.bytes.size() / 4);
    std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
    std::string h16(v.size() * 2, '\0');
    for (std::size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = static_cast<uint16_t>(formats::encode_element(formats::ElementFormat::fp16, v[i]));
      REQUIRE(formats::decode_element(formats::ElementFormat::fp16, h) == v[i]);
      std::memcpy(h16.data() + 2 * i, &h, 2);
    }
    t.dtype = "F16";
    t.bytes = h16;
    ++converted;
  }
  CHECK(converted > 10);
  const fs::path dh = tmp.path() / "f16";
  copy_model(name, dh);
  write_safetensors_raw(dh / "model.safetensors", as_f16);
  CHECK((fp32_logprobs(dh.string(), tokens).array() == ref.array()).all());

  // Sharded: two shards plus an index, tensors split alternately.
  const fs::path ds = tmp.path() / "sharded";
  copy_model(name, ds);
  fs::remove(ds / "model.safetensors");
  RawTensors s1, s2;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  int i = 0;
  for (const auto& [n, t] : as_f32) {
    const bool first = (i++ % 2) == 0;
    (first ? s1 : s2)[n] = t;
    index["weight_map"][n] = first ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  write_safetensors_raw(ds / "model-00001-of-00002.safetensors", s1);
  write_safetensors_raw(ds / "model-00002-of-00002.safetensors", s2);
  spit(ds / "model.safetensors.index.json", index.dump(2));
  CHECK((fp32_logprobs(ds.string(), tokens).array() == ref.array()).all());

  // An index naming a tensor its shard lacks, and a missing shard.
  index["weight_map"]["model.norm.weight"] = "model-00002-of-00002.safetensors";
  const bool in_first = s1.count("model.norm.weight") > 0;
  spit(ds / "model.safetensors.index.json", index.dump(2));
  if (in_first)
    CHECK(load_error(ds).find("the index places tensor 'model.norm.weight' in this shard, but its header has no such "
                              "tensor") != std::string::npos);
  index["weight_map"]["model.norm.weight"] = "model-00003-of-00002.safetensors";
  spit(ds / "model.safetensors.index.json", index.dump(2));
  CHECK(load_error(ds).find("model-00003-of-00002.safetensors' (holding tensor 'model.norm.weight') does not exist") !=
        std::string::npos);
}

TEST_CASE("inspect validates without reading weights and reports the architecture") {
  for (const std::string& name : golden_models()) {
    const CausalLM m = CausalLM::inspect(golden_dir(name));
    const std::string d = m.describe();
    CHECK(d.find("parameters") != std::string::npos);
    CHECK_THROWS_WITH(m.final_hidden({1, 2}, ssm::PrecisionPolicy::parse("conv:fp32")), doctest::Contains("inspect()"));
  }
  const ModelConfig q = CausalLM::inspect(golden_dir("qwen3_5_tiny")).config();
  CHECK(q.pattern() == "GG*G*");
  CHECK(q.gdn.num_k_heads == 2);
  CHECK(q.gdn.num_v_heads == 4);
  CHECK(q.gdn.dk == 128);
  CHECK(q.gdn.dv == 16);
  CHECK(q.attention.rotary_dim == 8);
  CHECK(q.tie_word_embeddings);
  const ModelConfig m = CausalLM::inspect(golden_dir("mamba2_tiny")).config();
  CHECK(m.mamba.n_groups == 2);
  CHECK(m.mamba.num_heads == 8);
  CHECK(m.mamba.state_size == 128);
  CHECK(m.mamba.head_dim == 16);
  CHECK(m.mamba.dt_min == doctest::Approx(0.004));
  CHECK(m.mamba.dt_max == doctest::Approx(0.5));
  const ModelConfig n = CausalLM::inspect(golden_dir("nemotron_h_tiny")).config();
  CHECK(n.mamba.norm_group_size == 64);
  CHECK(std::isinf(n.mamba.dt_max));
}

TEST_CASE("Qwen3.5 multimodal checkpoints: text_config, language_model prefix, visual and MTP weights ignored") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "vl";
  copy_model("qwen3_5_tiny", dir);
  const nlohmann::json text = read_json_file((dir / "config.json").string());
  nlohmann::json outer = {{"model_type", "qwen3_5"},
                          {"architectures", {"Qwen3_5ForConditionalGeneration"}},
                          {"text_config", text},
                          {"vision_config", {{"model_type", "qwen3_5_vision"}}}};
  outer["text_config"].erase("tie_word_embeddings");
  outer["tie_word_embeddings"] = true;  // top-level flag, as multimodal configs write it
  spit(dir / "config.json", outer.dump(2));
  RawTensors raw;
  for (auto& [n, t] : read_safetensors_raw(dir / "model.safetensors"))
    raw[n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n] = t;
  raw["model.visual.patch_embed.proj.weight"] = RawTensor{"F32", {2}, std::string(8, '\0')};
  raw["mtp.fc.weight"] = RawTensor{"BF16", {2}, std::string(4, '\0')};
  write_safetensors_raw(dir / "model.safetensors", raw);
  const auto tokens = read_tokens(golden_dir("qwen3_5_tiny") + "/tokens.npy");
  CHECK(
      (fp32_logprobs(dir.string(), tokens).array() == fp32_logprobs(golden_dir("qwen3_5_tiny"), tokens).array()).all());
  const CausalLM m = CausalLM::inspect(dir.string());
  CHECK(m.config().model_type == "qwen3_5");
  CHECK(m.config().tie_word_embeddings);

  outer["model_type"] = "qwen3_5_moe";
  spit(dir / "config.json", outer.dump(2));
  // The same dense weights under the MoE model type: refused, with what is missing.
  const std::string moe = load_error(dir);
  INFO(moe);
  CHECK(moe.find("missing config key \"num_experts\"") != std::string::npos);
}
