// Hostile config.json and checkpoint contents (issue 17): every structural field of every
// architecture is validated (positivity, divisibility, ranges, 64-bit products), every float field
// is finite and in range, integer keys never go through an undefined float->int conversion, and
// the loader refuses or warns loudly; each message names the file, the key and what was expected.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include <fmt/format.h>

#include "model/causal_lm.h"
#include "model/json_util.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/tensor_ops.h"
#include "test_model_util.h"

using namespace replayssm;
using namespace replayssm::model;
using namespace replayssm::test;
namespace fs = std::filesystem;

namespace {

std::string inspect_error(const fs::path& dir) {
  return error_of([&] { (void)CausalLM::inspect(dir.string()); });
}

// One edit of a golden model's config.json and a fragment its error must contain.
struct BadField {
  std::string model;
  std::function<void(nlohmann::json&)> edit;
  std::string expected;  // besides the config file's path
};

void check_rejected(const BadField& b) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model(b.model, dir);
  edit_config(dir, b.edit);
  const std::string cfg = (dir / "config.json").string();
  const std::string e = load_error(dir);
  CAPTURE(e);
  CHECK(contains(e, cfg));
  CHECK(contains(e, b.expected));
  // `replayssm info` (inspect) refuses the same config.
  CHECK(contains(inspect_error(dir), b.expected));
}

auto set(const std::string& key, nlohmann::json v) {
  return [key, v](nlohmann::json& j) { j[key] = v; };
}

// Captures std::cerr for the lifetime of the object.
class CerrCapture {
 public:
  CerrCapture() : old_(std::cerr.rdbuf(buf_.rdbuf())) {}
  ~CerrCapture() { std::cerr.rdbuf(old_); }
  std::string text() const { return buf_.str(); }

 private:
  std::ostringstream buf_;
  std::streambuf* old_;
};

void set_f32(RawTensor& t, std::size_t i, float v) { std::memcpy(t.bytes.data() + 4 * i, &v, 4); }

}  // namespace

TEST_CASE("Mamba-2: n_groups must divide num_heads (a group left over would leave heads uncomputed)") {
  // Before: accepted, heads 6 and 7 never computed, output read uninitialised memory.
  check_rejected({"mamba2_tiny", set("n_groups", 3),
                  "config key \"n_groups\" is 3, expected a divisor of num_heads = 8"});
  check_rejected({"mamba2_tiny", set("n_groups", 16),
                  "config key \"n_groups\" is 16, expected a divisor of num_heads = 8"});
  check_rejected({"nemotron_h_tiny", set("n_groups", 3),
                  "config key \"n_groups\" is 3, expected a divisor of mamba_num_heads = 8"});
  check_rejected({"nemotron_h_tiny", set("num_key_value_heads", 3),
                  "config key \"num_key_value_heads\" is 3, expected a divisor of num_attention_heads = 4"});
  check_rejected({"qwen3_5_tiny", set("linear_num_key_heads", 3),
                  "config key \"linear_num_key_heads\" is 3, expected a divisor of linear_num_value_heads = 4"});
  check_rejected({"qwen3_5_tiny", set("num_key_value_heads", 3),
                  "config key \"num_key_value_heads\" is 3, expected a divisor of num_attention_heads = 4"});
}

TEST_CASE("structural integers: positive, bounded, and widths computed in 64 bits") {
  const std::string positive = "expected a positive integer no larger than 268435456";
  for (const char* key : {"num_heads", "head_dim", "state_size", "n_groups", "conv_kernel", "vocab_size", "hidden_size",
                          "expand", "num_hidden_layers"}) {
    CAPTURE(key);
    check_rejected({"mamba2_tiny", set(key, 0), fmt::format("config key \"{}\" is 0, expected a positive integer", key)});
    check_rejected({"mamba2_tiny", set(key, -2), fmt::format("config key \"{}\" is -2, expected a positive", key)});
  }
  for (const char* key : {"mamba_num_heads", "mamba_head_dim", "ssm_state_size", "num_attention_heads", "head_dim",
                          "intermediate_size", "conv_kernel"}) {
    CAPTURE(key);
    check_rejected({"nemotron_h_tiny", set(key, 0), fmt::format("config key \"{}\" is 0, expected a positive", key)});
  }
  for (const char* key : {"linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                          "linear_conv_kernel_dim", "num_key_value_heads", "head_dim", "intermediate_size"}) {
    CAPTURE(key);
    check_rejected({"qwen3_5_tiny", set(key, -1), fmt::format("config key \"{}\" is -1, expected a positive", key)});
  }
  // A single field beyond the bound.
  check_rejected({"qwen3_5_tiny", set("vocab_size", int64_t{1} << 40),
                  "config key \"vocab_size\" is 1099511627776, " + positive});
  // A huge layer count with a 3-layer file: refused before allocating anything per layer.
  check_rejected({"mamba2_tiny", set("num_hidden_layers", int64_t{1} << 28),
                  "config key \"num_hidden_layers\" is 268435456, expected a positive integer no larger than 65536"});

  // Products that overflowed int (issue 17 #9: UB in intermediate() / conv_dim(), then a wrong
  // expected shape was printed) are computed in 64 bits and bounded.
  check_rejected({"nemotron_h_tiny",
                  [](nlohmann::json& j) {
                    j["mamba_num_heads"] = int64_t{1} << 26;
                    j["mamba_head_dim"] = 1024;
                  },
                  "mamba_num_heads * mamba_head_dim = 68719476736 exceeds 268435456"});
  check_rejected({"nemotron_h_tiny", set("ssm_state_size", int64_t{1} << 28),
                  "2 * n_groups * ssm_state_size = 1073741824 exceeds 268435456"});
  check_rejected({"mamba2_tiny",
                  [](nlohmann::json& j) {
                    j["num_heads"] = int64_t{1} << 26;
                    j["head_dim"] = 2;
                    j["hidden_size"] = int64_t{1} << 26;
                  },
                  "in_proj width 2 * num_heads * head_dim + 2 * n_groups * state_size + num_heads = 335544832 exceeds "
                  "268435456"});
  check_rejected({"qwen3_5_tiny",
                  [](nlohmann::json& j) {
                    j["linear_num_key_heads"] = int64_t{1} << 20;
                    j["linear_num_value_heads"] = int64_t{1} << 20;
                    j["linear_key_head_dim"] = 1024;
                  },
                  "linear_num_key_heads * linear_key_head_dim = 1073741824 exceeds 268435456"});
  check_rejected({"qwen3_5_tiny",
                  [](nlohmann::json& j) {
                    j["num_attention_heads"] = int64_t{1} << 20;
                    j["num_key_value_heads"] = 1;
                    j["head_dim"] = 256;
                  },
                  "2 * num_attention_heads * head_dim = 536870912 exceeds 268435456"});

  // The width helpers themselves never overflow: a shape built by hand past the bound throws.
  Mamba2Shape s;
  s.num_heads = 1 << 30;
  s.head_dim = 1 << 30;
  s.n_groups = 1;
  s.state_size = 1;
  CHECK_THROWS_WITH(s.intermediate(), doctest::Contains("exceeds 268435456"));
  GdnShape g;
  g.num_k_heads = g.num_v_heads = g.dk = g.dv = 1 << 16;
  CHECK_THROWS_WITH(g.conv_dim(), doctest::Contains("exceeds 268435456"));
}

TEST_CASE("RoPE: partial_rotary_factor must leave an even rotary dimension of at least 2") {
  // Before: 16 * 0.05 = 0.8 -> 0 rotary dims, silently no positional encoding.
  check_rejected({"qwen3_5_tiny", [](nlohmann::json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.05; },
                  "head_dim * partial_rotary_factor = 16 * 0.05 gives 0 rotary dimensions, expected an even number of "
                  "at least 2"});
  check_rejected({"qwen3_5_tiny", [](nlohmann::json& j) { j["rope_parameters"]["partial_rotary_factor"] = 0.1875; },
                  "gives 3 rotary dimensions, expected an even number"});
}

TEST_CASE("float fields: NaN, Infinity, negative and zero are rejected with the expected range") {
  const std::string eps = "expected a finite number in [1.1754944e-38, 1] (an RMSNorm epsilon)";
  const nlohmann::json nan = "NaN", inf = "Infinity", minus_inf = "-Infinity";
  for (const nlohmann::json& v : {nlohmann::json(-1e-5), nlohmann::json(0.0), nan, inf, minus_inf,
                                  nlohmann::json(2.0), nlohmann::json(1e-300)}) {
    CAPTURE(v.dump());
    check_rejected({"mamba2_tiny", set("layer_norm_epsilon", v), "config key \"layer_norm_epsilon\" is "});
    check_rejected({"mamba2_tiny", set("layer_norm_epsilon", v), eps});
    check_rejected({"nemotron_h_tiny", set("layer_norm_epsilon", v), eps});
    check_rejected({"qwen3_5_tiny", set("rms_norm_eps", v), "config key \"rms_norm_eps\" is "});
    check_rejected({"qwen3_5_tiny", set("rms_norm_eps", v), eps});
  }
  // The value is printed as read.
  check_rejected({"mamba2_tiny", set("layer_norm_epsilon", nan), "config key \"layer_norm_epsilon\" is nan, expected"});
  check_rejected({"mamba2_tiny", set("layer_norm_epsilon", inf), "config key \"layer_norm_epsilon\" is inf, expected"});

  const std::string theta = "expected a finite number in (1, 3.4028235e+38] (the RoPE base)";
  for (const nlohmann::json& v : {nlohmann::json(0.0), nlohmann::json(-10000.0), nlohmann::json(0.5), nan, inf,
                                  nlohmann::json(1e300)}) {
    CAPTURE(v.dump());
    check_rejected({"qwen3_5_tiny", [&](nlohmann::json& j) { j["rope_parameters"]["rope_theta"] = v; },
                    "rope_parameters: config key \"rope_theta\" is "});
    check_rejected({"qwen3_5_tiny", [&](nlohmann::json& j) { j["rope_parameters"]["rope_theta"] = v; }, theta});
    check_rejected({"qwen3_5_tiny",
                    [&](nlohmann::json& j) {
                      j.erase("rope_parameters");
                      j["rope_theta"] = v;
                    },
                    theta});
  }
  for (const nlohmann::json& v : {nlohmann::json(0.0), nlohmann::json(-0.25), nlohmann::json(1.5), nan, inf}) {
    CAPTURE(v.dump());
    check_rejected({"qwen3_5_tiny", [&](nlohmann::json& j) { j["rope_parameters"]["partial_rotary_factor"] = v; },
                    "config key \"partial_rotary_factor\" is "});
    check_rejected({"qwen3_5_tiny", [&](nlohmann::json& j) { j["rope_parameters"]["partial_rotary_factor"] = v; },
                    "expected a number in (0, 1]"});
  }
  const std::string limit =
      "expected [min, max] with 0 <= min <= max, max > 0, min finite and max finite or Infinity (float32 range)";
  for (const nlohmann::json& v :
       {nlohmann::json({nan, 0.1}), nlohmann::json({0.0, nan}), nlohmann::json({-1.0, 0.1}), nlohmann::json({0.5, 0.1}),
        nlohmann::json({0.0, 0.0}), nlohmann::json({inf, inf}), nlohmann::json({minus_inf, 0.1}),
        nlohmann::json({0.0, 1e300}), nlohmann::json({0.1}), nlohmann::json({0.0, 0.1, 0.2})}) {
    CAPTURE(v.dump());
    check_rejected({"mamba2_tiny", set("time_step_limit", v), "config key \"time_step_limit\" is "});
    check_rejected({"mamba2_tiny", set("time_step_limit", v), limit});
  }
  for (const nlohmann::json& v : {nlohmann::json(-0.001), nan, inf, nlohmann::json(1e300)}) {
    CAPTURE(v.dump());
    check_rejected({"nemotron_h_tiny", set("time_step_min", v), "config key \"time_step_min\" is "});
    check_rejected({"nemotron_h_tiny", set("time_step_min", v), "expected a finite number in [0, 3.4028235e+38]"});
  }
}

TEST_CASE("legitimate non-finite values stay accepted: dt_max = Infinity") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("mamba2_tiny", dir);
  edit_config(dir, set("time_step_limit", {0.0, "Infinity"}));
  const ModelConfig c = CausalLM::inspect(dir.string()).config();
  CHECK(c.mamba.dt_min == 0.0);
  CHECK(std::isinf(c.mamba.dt_max));
}

TEST_CASE("integer keys: huge, NaN and non-integral floats are errors, never an undefined conversion") {
  // get_int used to cast any float to int64 (UB for 1e300, NaN, 2^63); uint64 values wrapped negative.
  const nlohmann::json j = {{"huge", 1e300},      {"nan", "NaN"},  {"inf", "Infinity"}, {"two63", 9223372036854775808.0},
                            {"neg", -1e300},      {"half", 8.5},   {"u64", UINT64_MAX}, {"eight", 8.0},
                            {"minus", -4.0},      {"big", INT64_MAX}};
  const JsonObject o(j, "cfg.json");
  for (const char* key : {"huge", "nan", "inf", "two63", "neg", "half", "u64"}) {
    CAPTURE(key);
    const std::string e = error_of([&] { (void)o.get_int(key); });
    CHECK(contains(e, fmt::format("cfg.json: config key \"{}\" is ", key)));
    CHECK(contains(e, "expected an integer"));
  }
  CHECK(contains(error_of([&] { (void)o.get_int("u64"); }), "is 18446744073709551615, expected an integer"));
  CHECK(o.get_int("eight") == 8);
  CHECK(o.get_int("minus") == -4);
  CHECK(o.get_int("big") == INT64_MAX);

  check_rejected({"mamba2_tiny", set("num_heads", 1e300), "config key \"num_heads\" is 1e+300, expected an integer"});
  check_rejected({"mamba2_tiny", set("state_size", "NaN"), "config key \"state_size\" is \"NaN\", expected an integer"});
  check_rejected({"qwen3_5_tiny", set("num_hidden_layers", UINT64_MAX),
                  "config key \"num_hidden_layers\" is 18446744073709551615, expected an integer"});
}

TEST_CASE("bool and string fields of the wrong type are rejected, not read as defaults") {
  check_rejected({"mamba2_tiny", set("use_conv_bias", "false"),
                  "config key \"use_conv_bias\" is \"false\", expected true or false"});
  check_rejected({"mamba2_tiny", set("tie_word_embeddings", 1),
                  "config key \"tie_word_embeddings\" is 1, expected true or false"});
  check_rejected({"qwen3_5_tiny", set("attention_bias", "no"),
                  "config key \"attention_bias\" is \"no\", expected true or false"});
  check_rejected({"nemotron_h_tiny", set("mlp_hidden_act", 3), "config key \"mlp_hidden_act\" is 3, expected a string"});
}

TEST_CASE("layer lists must agree with every count that describes them") {
  check_rejected({"qwen3_5_tiny", set("num_hidden_layers", 4),
                  "layer_types has 5 entries, expected num_hidden_layers = 4"});
  // Nemotron-H: the pattern defines the layers; a num_hidden_layers or legacy pattern that
  // disagrees used to be ignored silently.
  check_rejected({"nemotron_h_tiny", set("num_hidden_layers", 5),
                  "config key \"num_hidden_layers\" is 5, expected 6 (the length of layers_block_type)"});
  check_rejected({"nemotron_h_tiny", set("hybrid_override_pattern", "M*-M-M"),
                  "config key \"hybrid_override_pattern\" is \"M*-M-M\", which disagrees with layers_block_type "
                  "(\"M*-M-*\"): expected one of the two, or the same layers"});
  // Agreeing spellings are fine.
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("nemotron_h_tiny", dir);
  edit_config(dir, [](nlohmann::json& j) {
    j["hybrid_override_pattern"] = "M*-M-*";
    j["num_hidden_layers"] = 6;
  });
  CHECK(CausalLM::inspect(dir.string()).config().pattern() == "M*-M-*");
}

TEST_CASE("layer count and vocabulary that disagree with the checkpoint name the tensor") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("mamba2_tiny", dir);
  const std::string st = (dir / "model.safetensors").string();
  edit_config(dir, set("num_hidden_layers", 4));
  CHECK(contains(load_error(dir), st + ": missing tensor 'backbone.layers.3.norm.weight' (expected shape [64])"));
  edit_config(dir, set("num_hidden_layers", 2));
  CHECK(contains(load_error(dir), "unexpected tensor(s) not used by the mamba2 ("));
  CHECK(contains(load_error(dir), "'backbone.layers.2."));
  edit_config(dir, [](nlohmann::json& j) {
    j["num_hidden_layers"] = 3;
    j["vocab_size"] = 300;
  });
  CHECK(contains(load_error(dir), st + ": tensor 'backbone.embeddings.weight' has shape [256, 64], expected [300, 64]"));
}

TEST_CASE("tied embeddings with a different lm_head.weight are refused; an identical copy is accepted") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("mamba2_tiny", dir);
  const fs::path st = dir / "model.safetensors";
  RawTensors raw = read_safetensors_raw(st);
  edit_config(dir, set("tie_word_embeddings", true));
  // The checkpoint's own (untied) lm_head differs from the embeddings: which one is meant?
  const std::string e = load_error(dir);
  CHECK(contains(e, st.string() + ": tensor 'lm_head.weight' differs from the embeddings 'backbone.embeddings.weight'"));
  CHECK(contains(e, "config.json says tie_word_embeddings = true"));
  CHECK(contains(e, "expected no lm_head.weight, an identical copy, or tie_word_embeddings = false"));
  CHECK(contains(inspect_error(dir), "differs from the embeddings"));

  raw["lm_head.weight"] = raw["backbone.embeddings.weight"];
  write_safetensors_raw(st, raw);
  CHECK(CausalLM::load(dir.string()).config().tie_word_embeddings);
  raw.erase("lm_head.weight");
  write_safetensors_raw(st, raw);
  CHECK(CausalLM::load(dir.string()).config().tie_word_embeddings);
  raw["lm_head.weight"] = raw["backbone.embeddings.weight"];
  raw["lm_head.weight"].shape = {64, 256};
  write_safetensors_raw(st, raw);
  CHECK(contains(load_error(dir), "tensor 'lm_head.weight' has shape [64, 256], expected [256, 64]"));
}

TEST_CASE("Qwen3.5 multimodal: tie_word_embeddings inside and outside text_config must agree") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("qwen3_5_tiny", dir);
  const nlohmann::json text = read_json_file((dir / "config.json").string());
  nlohmann::json outer = {{"model_type", "qwen3_5"}, {"text_config", text}, {"tie_word_embeddings", false}};
  spit(dir / "config.json", outer.dump(2));
  const std::string e = load_error(dir);
  CHECK(contains(e, (dir / "config.json").string() +
                        ": config key \"tie_word_embeddings\" is false, but text_config says true (expected one value)"));
}

TEST_CASE("non-finite weights load with a warning naming each tensor and the count; info shows them") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("mamba2_tiny", dir);
  const fs::path st = dir / "model.safetensors";
  RawTensors raw = read_safetensors_raw(st);
  RawTensor& d = raw["backbone.layers.1.mixer.D"];
  set_f32(d, 1, std::numeric_limits<float>::quiet_NaN());
  set_f32(d, 4, std::numeric_limits<float>::infinity());
  set_f32(d, 7, -std::numeric_limits<float>::infinity());
  // A BF16 tensor with one NaN (0x7fc1) among finite values.
  RawTensor& a = raw["backbone.layers.2.mixer.A_log"];
  std::string b16(a.bytes.size() / 2, '\0');
  for (std::size_t i = 0; i < b16.size() / 2; ++i) {
    uint32_t bits;
    std::memcpy(&bits, a.bytes.data() + 4 * i, 4);
    const uint16_t h = i == 5 ? uint16_t{0x7fc1} : static_cast<uint16_t>(bits >> 16);
    std::memcpy(b16.data() + 2 * i, &h, 2);
  }
  a.dtype = "BF16";
  a.bytes = b16;
  write_safetensors_raw(st, raw);

  std::string warnings;
  {
    CerrCapture cap;
    (void)CausalLM::load(dir.string());
    warnings = cap.text();
  }
  CAPTURE(warnings);
  CHECK(contains(warnings, "warning: " + st.string() +
                               ": tensor 'backbone.layers.1.mixer.D' holds 3 non-finite values (NaN or Inf) among 8; "
                               "loaded as stored"));
  CHECK(contains(warnings, "tensor 'backbone.layers.2.mixer.A_log' holds 1 non-finite value (NaN or Inf) among 8"));
  CHECK(!contains(warnings, "backbone.layers.0."));

  const std::string info = CausalLM::inspect(dir.string()).describe();
  CAPTURE(info);
  CHECK(contains(info, "non-finite     2 tensors hold NaN or Inf (loaded as stored):"));
  CHECK(contains(info, "backbone.layers.1.mixer.D: 3 of 8"));
  CHECK(contains(info, "backbone.layers.2.mixer.A_log: 1 of 8"));
  // A clean checkpoint says nothing of the kind.
  CHECK(!contains(CausalLM::inspect(golden_dir("mamba2_tiny")).describe(), "non-finite"));
}

TEST_CASE("directories, FIFOs and broken links in place of files get clear messages") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("mamba2_tiny", dir);
  const fs::path st = dir / "model.safetensors", cfg = dir / "config.json";

  SUBCASE("model.safetensors is a directory") {
    fs::remove(st);
    fs::create_directory(st);
    CHECK(contains(load_error(dir), st.string() + ": is a directory, expected the safetensors file"));
  }
  SUBCASE("config.json is a directory") {
    fs::remove(cfg);
    fs::create_directory(cfg);
    CHECK(contains(load_error(dir), cfg.string() + ": is a directory, expected a JSON file"));
  }
  SUBCASE("FIFOs do not hang the loader") {
    fs::remove(st);
    REQUIRE(::mkfifo(st.c_str(), 0600) == 0);
    CHECK(contains(load_error(dir), st.string() + ": is not a regular file, expected the safetensors file"));
    fs::remove(cfg);
    REQUIRE(::mkfifo(cfg.c_str(), 0600) == 0);
    CHECK(contains(load_error(dir), cfg.string() + ": is not a regular file, expected a JSON file"));
  }
  SUBCASE("broken symbolic links") {
    fs::remove(st);
    fs::create_symlink(tmp.path() / "gone.safetensors", st);
    CHECK(contains(load_error(dir), st.string() + ": is a broken symbolic link to '" +
                                        (tmp.path() / "gone.safetensors").string() + "'"));
    fs::remove(cfg);
    fs::create_symlink("gone.json", cfg);
    CHECK(contains(load_error(dir), cfg.string() + ": is a broken symbolic link to 'gone.json'"));
  }
}

TEST_CASE("a tensor stored in two shards is refused, not resolved silently") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("mamba2_tiny", dir);
  RawTensors raw = read_safetensors_raw(dir / "model.safetensors");
  fs::remove(dir / "model.safetensors");
  RawTensors s1, s2;
  nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
  int i = 0;
  for (const auto& [n, t] : raw) {
    const bool first = (i++ % 2) == 0;
    (first ? s1 : s2)[n] = t;
    index["weight_map"][n] = first ? "a.safetensors" : "b.safetensors";
  }
  const std::string victim = "backbone.layers.1.mixer.D";
  REQUIRE(s1.count(victim) + s2.count(victim) == 1);
  RawTensors& other = s1.count(victim) ? s2 : s1;
  other[victim] = raw[victim];
  set_f32(other[victim], 0, 123.0f);  // a stale, different copy
  write_safetensors_raw(dir / "a.safetensors", s1);
  write_safetensors_raw(dir / "b.safetensors", s2);
  spit(dir / "model.safetensors.index.json", index.dump());
  const std::string e = load_error(dir);
  CHECK(contains(e, (dir / "model.safetensors.index.json").string() + ": tensor '" + victim +
                        "' is stored in two shards"));
  CHECK(contains(e, (dir / "a.safetensors").string()));
  CHECK(contains(e, (dir / "b.safetensors").string()));
  CHECK(contains(e, "(expected one copy)"));
}

TEST_CASE("rms_norm_rows refuses a group that does not divide the width") {
  Mat x = Mat::Constant(2, 6, 0.5f);
  const Vec w = Vec::Ones(6);
  CHECK_THROWS_WITH(rms_norm_rows(x, w, 1e-6f, false, 4, 1), doctest::Contains("group 4 must divide the width 6"));
  CHECK_THROWS_WITH(rms_norm_rows(x, Vec::Ones(5), 1e-6f, false, 3, 1), doctest::Contains("weight has 5"));
  rms_norm_rows(x, w, 1e-6f, false, 3, 1);
  CHECK(x(1, 5) == doctest::Approx(1.0f / std::sqrt(1.0f + 4e-6f)));
}

TEST_CASE("model.safetensors beside an index, or an empty index, is refused") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("mamba2_tiny", dir);
  // Before: the index won silently, where transformers reads model.safetensors.
  spit(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", {{"lm_head.weight", "x.safetensors"}}}}.dump());
  CHECK(contains(load_error(dir), dir.string() + ": both model.safetensors and model.safetensors.index.json are present "
                                                 "(expected one of them"));
  fs::remove(dir / "model.safetensors");
  spit(dir / "model.safetensors.index.json", nlohmann::json{{"weight_map", nlohmann::json::object()}}.dump());
  CHECK(contains(load_error(dir), (dir / "model.safetensors.index.json").string() +
                                      ": missing or empty \"weight_map\" object (expected {tensor name: shard file})"));
}
