// Kimi Linear (kimi_linear): hostile config.json fields, both checkpoint spellings of its weights,
// KDA head indexing with more than one head, and the latent attention (q LoRA, biases) against a
// direct float64 evaluation of transformers' formulas. The FP32 forward against transformers and
// the policy effects run in test_model_goldens.cpp (kimi_linear_tiny is a golden model).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include <fmt/format.h>

#include "model/causal_lm.h"
#include "model/layers.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "test_model_util.h"

using namespace replayssm;
using namespace replayssm::model;
using namespace replayssm::test;
namespace fs = std::filesystem;

namespace {

const std::string kGolden = "kimi_linear_tiny";

// The load and inspect errors of the golden with `edit` applied to its config.json: both must name
// the file and contain `expected`.
void check_rejected(const std::function<void(nlohmann::json&)>& edit, const std::string& expected) {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model(kGolden, dir);
  edit_config(dir, edit);
  const std::string e = load_error(dir);
  CAPTURE(e);
  CHECK(contains(e, (dir / "config.json").string()));
  CHECK(contains(e, expected));
  CHECK(contains(error_of([&] { (void)CausalLM::inspect(dir.string()); }), expected));
}
auto set(const std::string& key, nlohmann::json v) {
  return [key, v](nlohmann::json& j) { j[key] = v; };
}
auto erase(const std::string& key) {
  return [key](nlohmann::json& j) { j.erase(key); };
}

Mat log_probs(const CausalLM& lm, const std::vector<int64_t>& tokens, const std::string& policy = "conv:fp32") {
  ForwardOptions o;
  o.threads = 2;
  return lm.log_probs(tokens, ssm::PrecisionPolicy::parse(policy), o);
}
std::vector<int64_t> golden_tokens() { return read_tokens(golden_dir(kGolden) + "/tokens.npy"); }

// Row-major tensor of `rows` rows: the bytes of row r.
std::string row_bytes(const RawTensor& t, int64_t r) {
  const std::size_t row = t.bytes.size() / static_cast<std::size_t>(t.shape[0]);
  return t.bytes.substr(static_cast<std::size_t>(r) * row, row);
}
// Other finite BF16 weights of the same shape: the rows of `t` in reverse order, signs flipped.
std::string other_rows(const RawTensor& t) {
  REQUIRE(t.dtype == "BF16");
  std::string out;
  for (int64_t r = t.shape[0] - 1; r >= 0; --r) out += row_bytes(t, r);
  for (std::size_t i = 1; i < out.size(); i += 2) out[i] = static_cast<char>(out[i] ^ 0x80);  // little-endian sign
  return out;
}

}  // namespace

TEST_CASE("kimi_linear config: MoE layers are refused at load, naming the file and the key") {
  const std::string moe = "Kimi Linear MoE layers: not supported yet (dense layers only)";
  check_rejected(set("mlp_layer_types", {"dense", "sparse"}),
                 moe + ": layer 1 is \"sparse\" by config key \"mlp_layer_types\"");
  // transformers' default without mlp_layer_types: only the first first_k_dense_replace (1) are dense.
  check_rejected(erase("mlp_layer_types"), moe + ": layer 1 is \"sparse\" by config key \"first_k_dense_replace\"");
  check_rejected(
      [](nlohmann::json& j) {
        j.erase("mlp_layer_types");
        j["first_k_dense_replace"] = 0;
      },
      moe + ": layer 0 is \"sparse\"");
  // All dense through first_k_dense_replace alone loads.
  TempDir tmp;
  copy_model(kGolden, tmp.path());
  edit_config(tmp.path(), [](nlohmann::json& j) {
    j.erase("mlp_layer_types");
    j["first_k_dense_replace"] = 2;
  });
  CHECK(load_error(tmp.path()) == "(no error)");
}

TEST_CASE("kimi_linear config: layer lists are checked against each other and the layer count") {
  check_rejected(set("mlp_layer_types", {"dense", "dense", "dense"}),
                 "mlp_layer_types has 3 entries, expected num_hidden_layers = 2");
  check_rejected(set("mlp_layer_types", {"dense", "moe"}), "mlp_layer_types[1] is \"moe\", expected \"dense\" or \"sparse\"");
  check_rejected(set("first_k_dense_replace", 1),
                 "config key \"first_k_dense_replace\" is 1, which disagrees with mlp_layer_types");
  check_rejected(set("first_k_dense_replace", -1), "config key \"first_k_dense_replace\" is -1, expected >= 0");
  check_rejected(set("layer_types", {"linear_attention"}), "layer_types has 1 entries, expected num_hidden_layers = 2");
  check_rejected(set("layer_types", {"linear_attention", "mamba"}),
                 "layer_types[1] is \"mamba\", expected \"linear_attention\" or \"full_attention\"");

  // The checkpoints' spelling: 1-based layer lists in linear_attn_config.
  auto lists = [](nlohmann::json full, nlohmann::json kda) {
    return [full, kda](nlohmann::json& j) {
      j.erase("layer_types");
      j["linear_attn_config"] = {{"full_attn_layers", full}, {"kda_layers", kda}};
    };
  };
  check_rejected(lists({0}, {1}), "config key \"full_attn_layers\" names layer 0, expected a layer number in [1, 2]");
  check_rejected(lists({3}, {1}), "names layer 3, expected a layer number in [1, 2]");
  check_rejected(lists({2}, {1, 2}), "config key \"kda_layers\" names layer 2 again");
  check_rejected(lists({2}, nlohmann::json::array()), "layer 1 (1-based) is in neither full_attn_layers nor kda_layers");
  check_rejected(lists({"2"}, {1}), "config key \"full_attn_layers\"[0] is \"2\", expected an integer layer number");
  check_rejected(
      [](nlohmann::json& j) { j["linear_attn_config"] = {{"full_attn_layers", {1}}, {"kda_layers", {2}}}; },
      "config keys \"layer_types\" and linear_attn_config's full_attn_layers/kda_layers describe different layers");

  // Lists that agree with layer_types, or replace it, give the same model.
  TempDir tmp;
  copy_model(kGolden, tmp.path());
  edit_config(tmp.path(), lists({2}, {1}));
  const ModelConfig c = ModelConfig::load(tmp.str());
  CHECK(c.pattern() == "K*");
  CHECK(c.ssm_layer_count() == 1);
}

TEST_CASE("kimi_linear config: KDA and latent-attention fields are validated") {
  for (const char* key : {"linear_num_heads", "linear_head_dim", "linear_conv_kernel_dim", "num_attention_heads",
                          "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "intermediate_size",
                          "hidden_size", "vocab_size"}) {
    CAPTURE(key);
    check_rejected(set(key, 0), fmt::format("config key \"{}\" is 0, expected a positive integer", key));
    check_rejected(set(key, -3), fmt::format("config key \"{}\" is -3, expected a positive integer", key));
  }
  // transformers cannot build these (None widths): missing, not defaulted.
  check_rejected(set("v_head_dim", nullptr), "v_head_dim");
  check_rejected(set("q_lora_rank", 0), "config key \"q_lora_rank\" is 0, expected a positive integer");
  check_rejected(set("num_key_value_heads", 1),
                 "config key \"num_key_value_heads\" is 1, expected num_attention_heads = 2");
  check_rejected(
      [](nlohmann::json& j) {
        j["linear_num_heads"] = int64_t{1} << 20;
        j["linear_head_dim"] = 1024;
      },
      "linear_num_heads * linear_head_dim = 1073741824 exceeds 268435456");
  check_rejected(set("linear_num_heads", int64_t{1} << 20),
                 "KDA conv width 3 * linear_num_heads * linear_head_dim = 402653184 exceeds 268435456");
  check_rejected(set("qk_rope_head_dim", int64_t{1} << 28), "qk_nope_head_dim + qk_rope_head_dim = 268435472 exceeds");
  // The checkpoints' linear_attn_config spelling must agree with the top-level one.
  check_rejected(set("linear_attn_config", {{"num_heads", 2}}),
                 "config key \"linear_num_heads\" is 1, but linear_attn_config.num_heads is 2 (expected one value)");
  check_rejected(set("linear_attn_config", {{"short_conv_kernel_size", 0}}),
                 "config key \"short_conv_kernel_size\" is 0, expected a positive integer");
  for (const char* eps : {"NaN", "Infinity"})
    check_rejected(set("rms_norm_eps", eps), "config key \"rms_norm_eps\" is");
  check_rejected(set("rms_norm_eps", 0.0), "config key \"rms_norm_eps\" is 0, expected a finite number in");
  check_rejected(set("linear_attn_config", {1, 2}), "config key \"linear_attn_config\" is [1,2], expected an object");
  check_rejected(set("hidden_act", "gelu"), "hidden_act \"gelu\" is not supported (expected \"silu\")");
}

TEST_CASE("kimi_linear weights: transformers' in-memory spelling loads to the same log-probs") {
  const std::vector<int64_t> tokens = golden_tokens();
  const Mat ref = log_probs(CausalLM::load(golden_dir(kGolden)), tokens);
  TempDir tmp;
  copy_model(kGolden, tmp.path());
  const fs::path st = tmp.path() / "model.safetensors";
  RawTensors t = read_safetensors_raw(st);
  const std::string a = "model.layers.0.self_attn.";
  RawTensor conv = t.at(a + "q_conv1d.weight");
  conv.shape[0] *= 3;
  conv.bytes += t.at(a + "k_conv1d.weight").bytes + t.at(a + "v_conv1d.weight").bytes;
  for (const char* part : {"q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"}) t.erase(a + part);
  t[a + "conv1d.weight"] = conv;
  for (const char* name : {"f_a_proj.weight", "f_b_proj.weight", "dt_bias", "A_log"}) {
    t[a + "forget_gate." + name] = t.at(a + name);
    t.erase(a + name);
  }
  for (int layer = 0; layer < 2; ++layer)
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const std::string from = fmt::format("model.layers.{}.block_sparse_moe.{}.weight", layer, proj);
      t[fmt::format("model.layers.{}.mlp.{}.weight", layer, proj)] = t.at(from);
      t.erase(from);
    }
  write_safetensors_raw(st, t);
  const Mat got = log_probs(CausalLM::load(tmp.str()), tokens);
  CHECK((got.array() == ref.array()).all());

  // Both spellings of one weight: refused, naming both and the file.
  RawTensors both = t;
  both[a + "dt_bias"] = t.at(a + "forget_gate.dt_bias");
  write_safetensors_raw(st, both);
  std::string e = load_error(tmp.path());
  CHECK(contains(e, st.string()));
  CHECK(contains(e, "tensors 'model.layers.0.self_attn.dt_bias' and 'model.layers.0.self_attn.forget_gate.dt_bias' "
                    "are both present"));
  both = t;
  both[a + "k_conv1d.weight"] = read_safetensors_raw(golden_dir(kGolden) + "/model.safetensors").at(a + "k_conv1d.weight");
  write_safetensors_raw(st, both);
  e = load_error(tmp.path());
  CHECK(contains(e, "'model.layers.0.self_attn.conv1d.weight' and 'model.layers.0.self_attn.k_conv1d.weight' are "
                    "both present"));
  both = t;
  both["model.layers.1.block_sparse_moe.down_proj.weight"] = t.at("model.layers.1.mlp.down_proj.weight");
  write_safetensors_raw(st, both);
  CHECK(contains(load_error(tmp.path()), "layer 1 has both 'model.layers.1.block_sparse_moe.*' and "
                                         "'model.layers.1.mlp.*' tensors"));
}

TEST_CASE("kimi_linear weights: missing or misshapen KDA tensors are named") {
  TempDir tmp;
  copy_model(kGolden, tmp.path());
  // A q LoRA config over a plain q_proj checkpoint: the first LoRA tensor is missing.
  edit_config(tmp.path(), set("q_lora_rank", 8));
  CHECK(contains(load_error(tmp.path()), "missing tensor 'model.layers.1.self_attn.q_a_proj.weight' (expected shape "
                                         "[8, 32])"));
  copy_model(kGolden, tmp.path());
  const fs::path st = tmp.path() / "model.safetensors";
  const RawTensors orig = read_safetensors_raw(st);
  const std::string a = "model.layers.0.self_attn.";
  RawTensors t = orig;
  t.erase(a + "v_conv1d.weight");
  write_safetensors_raw(st, t);
  CHECK(contains(load_error(tmp.path()), "v_conv1d.weight"));
  t = orig;
  t[a + "A_log"].shape = {1};  // the published layout is [1, 1, heads, 1]
  write_safetensors_raw(st, t);
  const std::string e = load_error(tmp.path());
  CHECK(contains(e, a + "A_log"));
  CHECK(contains(e, "[1, 1, 1, 1]"));
}

TEST_CASE("KDA with two heads: each head reads its own projections, decay, beta, gate and o_proj columns") {
  // Head 1 holds the golden's single head, head 0 other weights whose o_proj columns are zero:
  // the model must give the golden's log-probs (a head reading another head's slice would not).
  const std::vector<int64_t> tokens = golden_tokens();
  const CausalLM one = CausalLM::load(golden_dir(kGolden));
  const Mat ref = log_probs(one, tokens);
  TempDir tmp;
  copy_model(kGolden, tmp.path());
  edit_config(tmp.path(), set("linear_num_heads", 2));
  const fs::path st = tmp.path() / "model.safetensors";
  RawTensors t = read_safetensors_raw(st);
  const std::string a = "model.layers.0.self_attn.";
  for (const char* name : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "q_conv1d.weight", "k_conv1d.weight",
                           "v_conv1d.weight", "f_b_proj.weight", "g_b_proj.weight", "dt_bias", "b_proj.weight"}) {
    RawTensor& r = t.at(a + name);
    r.bytes = other_rows(r) + r.bytes;
    r.shape[0] *= 2;
  }
  RawTensor& a_log = t.at(a + "A_log");
  REQUIRE(a_log.dtype == "BF16");
  const uint16_t other_rate = 0x3f80;  // log(A) = 1 for head 0
  a_log.bytes = std::string(reinterpret_cast<const char*>(&other_rate), 2) + a_log.bytes;
  a_log.shape = {1, 1, 2, 1};
  RawTensor& o = t.at(a + "o_proj.weight");
  std::string wide;
  for (int64_t r = 0; r < o.shape[0]; ++r) wide += std::string(row_bytes(o, r).size(), '\0') + row_bytes(o, r);
  o.bytes = wide;
  o.shape[1] *= 2;
  write_safetensors_raw(st, t);
  const CausalLM two = CausalLM::load(tmp.str());
  CHECK(two.config().kda.num_heads == 2);
  CHECK(two.parameter_count() > one.parameter_count());
  for (const std::string policy : {"conv:fp32", "shared:nvfp4+rtn@16"}) {
    CAPTURE(policy);
    const Mat got = log_probs(two, tokens, policy), want = policy == "conv:fp32" ? ref : log_probs(one, tokens, policy);
    CHECK_CLOSE(compare_close(got.data(), want.data(), static_cast<std::size_t>(want.size()), {1e-5, 1e-5},
                              "two-head KDA vs the golden's one head"));
  }
}

namespace {

// transformers' KimiLinearAttention written out in float64 (dense softmax over all positions).
Mat mla_reference(const std::map<std::string, Mat>& w, const Mat& x, const MlaShape& s) {
  using D = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  auto lin = [&](const D& in, const std::string& name, bool bias) {
    D y = in * w.at(name + ".weight").cast<double>().transpose();
    if (bias) y.rowwise() += w.at(name + ".bias").cast<double>().row(0);
    return y;
  };
  auto rms = [&](D m, const std::string& name) {
    for (Eigen::Index r = 0; r < m.rows(); ++r)
      m.row(r) = m.row(r).cwiseProduct(w.at(name).cast<double>().row(0)) / std::sqrt(m.row(r).squaredNorm() / m.cols() + 1e-6);
    return m;
  };
  const D xd = x.cast<double>();
  const D q = lin(rms(lin(xd, "a.q_a_proj", true), "a.q_a_layernorm.weight"), "a.q_b_proj", false);
  const D latent = lin(xd, "a.kv_a_proj_with_mqa", true);
  const D kvb = lin(rms(latent.leftCols(s.kv_lora_rank), "a.kv_a_layernorm.weight"), "a.kv_b_proj", false);
  const int n = static_cast<int>(x.rows()), qk = s.qk_head_dim(), dv = s.v_head_dim, nope = s.qk_nope_head_dim;
  D att(n, s.num_heads * dv);
  for (int h = 0; h < s.num_heads; ++h)
    for (int t = 0; t < n; ++t) {
      std::vector<double> sc(t + 1);
      double mx = -1e300, sum = 0;
      for (int u = 0; u <= t; ++u) {
        double dot = 0;
        for (int i = 0; i < qk; ++i) {
          const double key = i < nope ? kvb(u, h * (nope + dv) + i) : latent(u, s.kv_lora_rank + i - nope);
          dot += q(t, h * qk + i) * key;
        }
        sc[u] = dot / std::sqrt(static_cast<double>(qk));
        mx = std::max(mx, sc[u]);
      }
      for (double& e : sc) sum += (e = std::exp(e - mx));
      for (int i = 0; i < dv; ++i) {
        double acc = 0;
        for (int u = 0; u <= t; ++u) acc += sc[u] / sum * kvb(u, h * (nope + dv) + nope + i);
        att(t, h * dv + i) = acc;
      }
    }
  return lin(att, "a.o_proj", true).cast<float>();
}

}  // namespace

TEST_CASE("latent attention with q LoRA and biases equals transformers' formulas in float64") {
  MlaShape s;
  s.num_heads = 3;
  s.q_lora_rank = 12;
  s.kv_lora_rank = 10;
  s.qk_nope_head_dim = 6;
  s.qk_rope_head_dim = 4;
  s.v_head_dim = 5;
  s.bias = true;
  const int hidden = 16, n = 150;  // 150 positions: three key blocks of 64, the last one partial
  std::mt19937 rng(static_cast<uint32_t>(kBaseSeed));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](int r, int c, float scale) {
    Mat m(r, c);
    for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = scale * normal(rng);
    return m;
  };
  std::map<std::string, Mat> w = {
      {"a.q_a_proj.weight", random(12, hidden, 0.3f)},       {"a.q_a_proj.bias", random(1, 12, 0.1f)},
      {"a.q_a_layernorm.weight", random(1, 12, 0.2f).array() + 1.0f},
      {"a.q_b_proj.weight", random(30, 12, 0.4f)},           {"a.kv_a_proj_with_mqa.weight", random(14, hidden, 0.3f)},
      {"a.kv_a_proj_with_mqa.bias", random(1, 14, 0.1f)},    {"a.kv_a_layernorm.weight", random(1, 10, 0.2f).array() + 1.0f},
      {"a.kv_b_proj.weight", random(33, 10, 0.4f)},          {"a.o_proj.weight", random(hidden, 15, 0.3f)},
      {"a.o_proj.bias", random(1, hidden, 0.1f)}};
  RawTensors raw;
  for (const auto& [name, m] : w) {
    const bool vec = name.ends_with(".bias") || name.ends_with("layernorm.weight");
    raw[name] = RawTensor{"F32", vec ? std::vector<int64_t>{m.cols()} : std::vector<int64_t>{m.rows(), m.cols()},
                          std::string(reinterpret_cast<const char*>(m.data()), m.size() * sizeof(float))};
  }
  TempDir tmp;
  write_safetensors_raw(tmp.path() / "model.safetensors", raw);
  TensorStore store(tmp.str());
  WeightLoader loader(store, false);
  const MlaAttention att(loader, "a", s, hidden);
  store.check_all_used("latent attention test");
  const Mat x = random(n, hidden, 1.0f);
  Mat got;
  const ssm::PrecisionPolicy fp32 = ssm::PrecisionPolicy::parse("conv:fp32");
  att.forward(x, got, LayerContext{0, &fp32, 3});
  const Mat want = mla_reference(w, x, s);
  REQUIRE(got.rows() == n);
  REQUIRE(got.cols() == hidden);
  CHECK_CLOSE(compare_close(got.data(), want.data(), static_cast<std::size_t>(want.size()), {1e-5, 1e-5},
                            "MLA vs float64 formulas"));
  // The positions are causal: changing the last input changes only the last output row.
  Mat x2 = x, got2;
  x2.row(n - 1) *= -1.0f;
  att.forward(x2, got2, LayerContext{0, &fp32, 3});
  CHECK((got2.topRows(n - 1).array() == got.topRows(n - 1).array()).all());
  CHECK((got2.row(n - 1).array() != got.row(n - 1).array()).any());
}
