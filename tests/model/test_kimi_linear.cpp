// Kimi Linear (kimi_linear): hostile config.json fields (MoE ones included), both checkpoint
// spellings of its weights (published per-expert w1/w3/w2, transformers' fused experts),
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

TEST_CASE("kimi_linear config: sparse layers read the MoE shape (KimiLinearConfig's keys and defaults)") {
  const ModelConfig c = ModelConfig::load(golden_dir(kGolden));
  CHECK(c.moe_mlp_layers == std::vector<int>{1});
  CHECK(!c.layer_mlp_is_moe(0));
  CHECK(c.layer_mlp_is_moe(1));
  CHECK(c.moe_layer_count() == 1);
  CHECK(c.mlp.intermediate_size == 64);
  const RouterSpec& r = c.moe.router;
  CHECK(r.score == RouterSpec::Score::sigmoid);
  CHECK(r.n_experts == 8);
  CHECK(r.top_k == 2);
  CHECK(r.n_group == 4);
  CHECK(r.topk_group == 2);
  CHECK(r.correction_bias);
  CHECK(r.normalise);
  CHECK(r.norm_epsilon == 1e-20f);
  CHECK(r.scaling == 2.446f);
  CHECK(c.moe.expert_intermediate == 16);
  CHECK(c.moe.activation == ExpertActivation::swiglu);
  CHECK(c.moe.shared_intermediate == 16);
  CHECK(!c.moe.shared_gate);
  CHECK(c.moe.expert_gate_name == "w1");
  CHECK(c.moe.expert_up_name == "w3");
  CHECK(c.moe.expert_down_name == "w2");

  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  // transformers' attribute aliases read as the written names; moe_renormalize false is read.
  copy_model(kGolden, dir);
  edit_config(dir, [](nlohmann::json& j) {
    for (const auto& [written, alias] : {std::pair<const char*, const char*>{"num_experts", "num_local_experts"},
                                         {"num_experts_per_token", "num_experts_per_tok"},
                                         {"num_expert_group", "n_group"},
                                         {"num_shared_experts", "n_shared_experts"},
                                         {"moe_renormalize", "norm_topk_prob"}}) {
      j[alias] = j[written];
      j.erase(written);
    }
    j["norm_topk_prob"] = false;
  });
  ModelConfig a = ModelConfig::load(dir.string());
  CHECK(a.moe.router.n_experts == 8);
  CHECK(a.moe.router.top_k == 2);
  CHECK(a.moe.router.n_group == 4);
  CHECK(!a.moe.router.normalise);
  CHECK(a.moe.shared_intermediate == 16);
  // Several shared experts are one MLP of their summed width.
  edit_config(dir, [](nlohmann::json& j) { j["n_shared_experts"] = 3; });
  CHECK(ModelConfig::load(dir.string()).moe.shared_intermediate == 48);
  // Without mlp_layer_types, transformers' default: layers from first_k_dense_replace (1) on are sparse.
  copy_model(kGolden, dir);
  edit_config(dir, erase("mlp_layer_types"));
  CHECK(ModelConfig::load(dir.string()).moe_mlp_layers == std::vector<int>{1});
  CHECK(load_error(dir) == "(no error)");
  // KimiLinearConfig's defaults where a key is absent (256 experts, top 8, ...).
  edit_config(dir, [](nlohmann::json& j) {
    for (const char* k : {"num_experts", "num_experts_per_token", "num_expert_group", "topk_group",
                          "num_shared_experts", "moe_renormalize", "routed_scaling_factor", "moe_intermediate_size"})
      j.erase(k);
  });
  a = ModelConfig::load(dir.string());
  CHECK(a.moe.router.n_experts == 256);
  CHECK(a.moe.router.top_k == 8);
  CHECK(a.moe.router.n_group == 1);
  CHECK(a.moe.router.topk_group == 1);
  CHECK(a.moe.router.normalise);
  CHECK(a.moe.router.scaling == 2.446f);
  CHECK(a.moe.expert_intermediate == 1024);
  CHECK(a.moe.shared_intermediate == 1024);
  // Every layer sparse: no dense MLP, so intermediate_size is not needed.
  edit_config(dir, [](nlohmann::json& j) {
    j["first_k_dense_replace"] = 0;
    j.erase("intermediate_size");
  });
  a = ModelConfig::load(dir.string());
  CHECK(a.moe_mlp_layers == std::vector<int>{0, 1});
  CHECK(a.mlp.intermediate_size == 0);
}

TEST_CASE("kimi_linear config: bad MoE fields are refused, naming the file, the key and the expectation") {
  for (const std::string key : {"num_experts", "num_experts_per_token", "num_expert_group", "topk_group",
                                 "num_shared_experts", "moe_intermediate_size"}) {
    CAPTURE(key);
    check_rejected(set(key, 0), fmt::format("config key \"{}\" is 0, expected a positive integer", key));
    check_rejected(set(key, -2), fmt::format("config key \"{}\" is -2", key));
  }
  // The alias spellings alone are checked alike.
  for (const auto& [written, alias] : {std::pair<const char*, std::string>{"num_experts", "num_local_experts"},
                                       {"num_expert_group", "n_group"},
                                       {"num_shared_experts", "n_shared_experts"}}) {
    CAPTURE(alias);
    check_rejected(
        [written = std::string(written), alias = alias](nlohmann::json& j) {
          j.erase(written);
          j[alias] = 0;
        },
        fmt::format("config key \"{}\" is 0, expected a positive integer", alias));
  }
  check_rejected(set("num_experts_per_token", 9),
                 "config key \"num_experts_per_token\" is 9, expected at most num_experts = 8 (each token picks "
                 "distinct experts)");
  check_rejected(set("num_expert_group", 3),
                 "config key \"num_expert_group\" is 3, expected a divisor of num_experts = 8");
  check_rejected(set("topk_group", 5), "config key \"topk_group\" is 5, expected at most num_expert_group = 4");
  check_rejected(set("num_expert_group", 8),
                 "num_experts / num_expert_group = 8 / 8 leaves 1 expert per group, expected at least 2");
  check_rejected(
      [](nlohmann::json& j) {
        j["topk_group"] = 1;
        j["num_experts_per_token"] = 3;
      },
      "topk_group * (num_experts / num_expert_group) = 1 * 2 experts compete, expected at least "
      "num_experts_per_token = 3");
  for (const nlohmann::json& v : {nlohmann::json(0.0), nlohmann::json(-1.5), nlohmann::json("NaN"),
                                  nlohmann::json("Infinity"), nlohmann::json(1e7)}) {
    CAPTURE(v.dump());
    check_rejected(set("routed_scaling_factor", v), "config key \"routed_scaling_factor\" is");
    check_rejected(set("routed_scaling_factor", v), "expected a finite number in (0, 1e6]");
  }
  check_rejected(set("moe_renormalize", "yes"), "moe_renormalize");
  check_rejected(set("num_experts_per_token", nullptr),
                 "config key \"num_experts_per_token\" is null, expected a positive integer");
  check_rejected(set("topk_group", nullptr), "config key \"topk_group\" is null, expected a positive integer");
  // Both spellings of one field with different values: which one is meant is open.
  check_rejected(set("num_local_experts", 16),
                 "config keys \"num_experts\" (8) and \"num_local_experts\" (16) name the same field (expected one "
                 "value)");
  check_rejected(set("norm_topk_prob", false),
                 "config keys \"moe_renormalize\" (true) and \"norm_topk_prob\" (false) name the same field");
  check_rejected(set("n_group", 2), "config keys \"num_expert_group\" (4) and \"n_group\" (2) name the same field");
  // The same value under both spellings is no contradiction.
  TempDir tmp;
  copy_model(kGolden, tmp.path());
  edit_config(tmp.path(), set("num_experts_per_tok", 2));
  CHECK(load_error(tmp.path()) == "(no error)");
  // Remote-code keys that transformers 5.17 ignores: refused where they mean another computation.
  check_rejected(set("moe_layer_freq", 2),
                 "config key \"moe_layer_freq\" is 2, but transformers 5.17 makes every layer from "
                 "first_k_dense_replace on sparse: expected 1 or absent");
  check_rejected(set("moe_router_activation_func", "softmax"),
                 "config key \"moe_router_activation_func\" is \"softmax\", but Kimi Linear's router (transformers "
                 "5.17) scores by sigmoid");
  copy_model(kGolden, tmp.path());
  edit_config(tmp.path(), [](nlohmann::json& j) {
    j["moe_layer_freq"] = 1;
    j["moe_router_activation_func"] = "sigmoid";
  });
  CHECK(load_error(tmp.path()) == "(no error)");
  check_rejected(
      [](nlohmann::json& j) {
        j["moe_intermediate_size"] = int64_t{1} << 27;
        j["num_shared_experts"] = 4;
      },
      "moe_intermediate_size * num_shared_experts = 536870912 exceeds 268435456");
}

TEST_CASE("kimi_linear config: which MLPs are sparse follows mlp_layer_types or first_k_dense_replace") {
  // Layer 0 sparse over a checkpoint whose layer 0 is dense: its router is missing, named with its shape.
  TempDir tmp;
  copy_model(kGolden, tmp.path());
  edit_config(tmp.path(), set("mlp_layer_types", {"sparse", "sparse"}));
  std::string e = load_error(tmp.path());
  CHECK(contains(e, "missing tensor 'model.layers.0.block_sparse_moe.gate.weight' (expected shape [8, 32])"));
  // All dense over a checkpoint with experts in layer 1: the dense MLP's tensor is missing.
  edit_config(tmp.path(), [](nlohmann::json& j) {
    j.erase("mlp_layer_types");
    j["first_k_dense_replace"] = 2;
  });
  e = load_error(tmp.path());
  CHECK(contains(e, "missing tensor 'model.layers.1.block_sparse_moe.gate_proj.weight' (expected shape [64, 32])"));
}

TEST_CASE("kimi_linear config: layer lists are checked against each other and the layer count") {
  check_rejected(set("mlp_layer_types", {"dense", "dense", "dense"}),
                 "mlp_layer_types has 3 entries, expected num_hidden_layers = 2");
  check_rejected(set("mlp_layer_types", {"dense", "moe"}), "mlp_layer_types[1] is \"moe\", expected \"dense\" or \"sparse\"");
  check_rejected(set("first_k_dense_replace", 2),
                 "config key \"first_k_dense_replace\" is 2, which disagrees with mlp_layer_types");
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
  // Every block_sparse_moe tensor renamed mlp (layer 0's dense MLP, layer 1's router and shared
  // experts), then layer 1's experts fused as transformers holds them: gate_up_proj [E, 2I, H] (w1
  // rows, then w3 rows, per expert) and down_proj [E, H, I].
  const std::string published = "block_sparse_moe.";
  for (const auto& [name, tensor] : RawTensors(t))
    if (const auto at = name.find(published); at != std::string::npos) {
      t[name.substr(0, at) + "mlp." + name.substr(at + published.size())] = tensor;
      t.erase(name);
    }
  const std::string experts = "model.layers.1.mlp.experts.";
  RawTensor gate_up{"BF16", {8, 32, 32}, ""}, down{"BF16", {8, 32, 16}, ""};
  for (int x = 0; x < 8; ++x) {
    for (const char* w : {"w1", "w3", "w2"}) {
      const std::string name = fmt::format("{}{}.{}.weight", experts, x, w);
      (std::string(w) == "w2" ? down : gate_up).bytes += t.at(name).bytes;
      t.erase(name);
    }
  }
  t[experts + "gate_up_proj"] = gate_up;
  t[experts + "down_proj"] = down;
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
  // Both prefixes for one MLP: the dense layer's down_proj, the MoE layer's router.
  for (const auto& [layer, probe] : {std::pair<int, const char*>{0, "down_proj.weight"}, {1, "gate.weight"}}) {
    CAPTURE(layer);
    both = t;
    both[fmt::format("model.layers.{}.block_sparse_moe.{}", layer, probe)] =
        t.at(fmt::format("model.layers.{}.mlp.{}", layer, probe));
    write_safetensors_raw(st, both);
    CHECK(contains(load_error(tmp.path()), fmt::format("layer {} has both 'model.layers.{}.block_sparse_moe.*' and "
                                                       "'model.layers.{}.mlp.*' tensors",
                                                       layer, layer, layer)));
  }
}

TEST_CASE("kimi_linear weights: missing or misshapen MoE tensors are named with the expected shape") {
  TempDir tmp;
  copy_model(kGolden, tmp.path());
  const fs::path st = tmp.path() / "model.safetensors";
  const RawTensors orig = read_safetensors_raw(st);
  const std::string m = "model.layers.1.block_sparse_moe.";
  for (const auto& [name, shape] :
       {std::pair<std::string, std::string>{"experts.5.w3.weight", "[16, 32]"}, {"experts.7.w2.weight", "[32, 16]"},
        {"experts.0.w1.weight", "[16, 32]"}, {"gate.weight", "[8, 32]"}, {"gate.e_score_correction_bias", "[8]"},
        {"shared_experts.up_proj.weight", "[16, 32]"}}) {
    CAPTURE(name);
    RawTensors t = orig;
    t.erase(m + name);
    write_safetensors_raw(st, t);
    std::string e = load_error(tmp.path());
    CHECK(contains(e, st.string()));
    CHECK(contains(e, fmt::format("missing tensor '{}{}' (expected shape {})", m, name, shape)));
    // The same tensor with one row too few.
    t = orig;
    RawTensor& r = t[m + name];
    r.bytes.resize(r.bytes.size() - r.bytes.size() / static_cast<std::size_t>(r.shape[0]));
    r.shape[0] -= 1;
    write_safetensors_raw(st, t);
    e = load_error(tmp.path());
    CHECK(contains(e, m + name));
    CHECK(contains(e, shape));
  }
  // Two shared experts make one MLP twice as wide: the checkpoint's single one no longer fits.
  write_safetensors_raw(st, orig);
  edit_config(tmp.path(), set("num_shared_experts", 2));
  const std::string e = load_error(tmp.path());
  CHECK(contains(e, m + "shared_experts.gate_proj.weight"));
  CHECK(contains(e, "[32, 32]"));
  // An expert past num_experts is an extra tensor, refused rather than ignored.
  copy_model(kGolden, tmp.path());
  RawTensors t = orig;
  t[m + "experts.8.w1.weight"] = orig.at(m + "experts.0.w1.weight");
  write_safetensors_raw(st, t);
  CHECK(contains(load_error(tmp.path()), m + "experts.8.w1.weight"));
}

TEST_CASE("kimi_linear golden: routing spreads over every expert of its MoE layer") {
  const nlohmann::json meta = read_json_file(golden_dir(kGolden) + "/golden.json");
  REQUIRE(meta.contains("routing"));
  const auto counts = meta["routing"]["counts"]["model.layers.1.mlp.gate"].get<std::vector<int64_t>>();
  REQUIRE(counts.size() == 8);
  int64_t total = 0;
  for (const int64_t c : counts) {
    CHECK(c > 0);
    total += c;
  }
  CHECK(total == 320 * 2);  // N tokens x top 2
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
