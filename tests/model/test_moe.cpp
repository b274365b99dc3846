// Mixture-of-experts layers (model/moe.h): the routers against hand-worked cases, the MoE goldens'
// routing spread, thread and chunk independence, memory estimates, and every refused config
// field and expert tensor (messages name the file, the key or tensor, and the expectation).
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "model/causal_lm.h"
#include "model/moe.h"
#include "model/safetensors.h"
#include "test_model_util.h"

using namespace replayssm;
using namespace replayssm::model;
using replayssm::test::contains;
using replayssm::test::copy_model;
using replayssm::test::edit_config;
using replayssm::test::golden_dir;
using replayssm::test::load_error;
using replayssm::test::RawTensors;
using replayssm::test::read_safetensors_raw;
using replayssm::test::read_tokens;
using replayssm::test::TempDir;
using replayssm::test::write_safetensors_raw;
namespace fs = std::filesystem;

namespace {

Mat logits_row(std::initializer_list<float> v) {
  Mat m(1, static_cast<Eigen::Index>(v.size()));
  Eigen::Index i = 0;
  for (float x : v) m(0, i++) = x;
  return m;
}

Mat run(const CausalLM& lm, const std::vector<int64_t>& tokens, int threads, int chunk = 256) {
  ForwardOptions o;
  o.threads = threads;
  o.chunk_positions = chunk;
  return lm.log_probs(tokens, ssm::PrecisionPolicy::parse("conv:fp32"), o);
}

}  // namespace

TEST_CASE("softmax router: top-k of the softmax, renormalised, slots in ascending expert order") {
  RouterSpec r;
  r.score = RouterSpec::Score::softmax;
  r.n_experts = 4;
  r.top_k = 2;
  const Routing got = route(logits_row({0.5f, 2.0f, -1.0f, 1.0f}), r, Vec());
  REQUIRE(got.expert == std::vector<int>{1, 3});
  // renormalised softmax of the two best = softmax over {2, 1}
  const double w1 = 1.0 / (1.0 + std::exp(-1.0));
  CHECK(got.weight[0] == doctest::Approx(w1).epsilon(1e-6));
  CHECK(got.weight[1] == doctest::Approx(1.0 - w1).epsilon(1e-6));
  r.normalise = false;
  const Routing raw = route(logits_row({0.5f, 2.0f, -1.0f, 1.0f}), r, Vec());
  const double z = std::exp(0.5) + std::exp(2.0) + std::exp(-1.0) + std::exp(1.0);
  CHECK(raw.weight[0] == doctest::Approx(std::exp(2.0) / z).epsilon(1e-6));
}

TEST_CASE("sigmoid grouped router: correction bias picks, scores weigh, groups restrict, scaling multiplies") {
  RouterSpec r;
  r.score = RouterSpec::Score::sigmoid;
  r.n_experts = 6;
  r.top_k = 2;
  r.n_group = 3;
  r.topk_group = 1;
  r.correction_bias = true;
  r.normalise = true;
  r.norm_epsilon = 1e-20f;
  r.scaling = 2.5f;
  // groups {0,1} {2,3} {4,5}; expert 4 has the best single logit, but group {2,3} has the best two
  const Mat l = logits_row({0.0f, 0.1f, 1.0f, 1.2f, 3.0f, -3.0f});
  Vec bias = Vec::Zero(6);
  Routing got = route(l, r, bias);
  REQUIRE(got.expert == std::vector<int>{2, 3});
  const float s2 = 1.0f / (1.0f + std::exp(-1.0f)), s3 = 1.0f / (1.0f + std::exp(-1.2f));
  CHECK(got.weight[0] == doctest::Approx(2.5 * s2 / (s2 + s3)).epsilon(1e-6));
  CHECK(got.weight[1] == doctest::Approx(2.5 * s3 / (s2 + s3)).epsilon(1e-6));
  // a bias on expert 5 makes group {4,5} win; the weights still come from the unbiased scores
  bias[5] = 2.0f;
  got = route(l, r, bias);
  REQUIRE(got.expert == std::vector<int>{4, 5});
  const float s4 = 1.0f / (1.0f + std::exp(-3.0f)), s5 = 1.0f / (1.0f + std::exp(3.0f));
  CHECK(got.weight[1] == doctest::Approx(2.5 * s5 / (s4 + s5)).epsilon(1e-5));
  // all groups allowed: the best two by choice score over all experts
  r.topk_group = 3;
  bias.setZero();
  got = route(l, r, bias);
  CHECK(got.expert == std::vector<int>{3, 4});
  // not renormalised: the scores times the scaling
  r.normalise = false;
  got = route(l, r, bias);
  CHECK(got.weight[1] == doctest::Approx(2.5 * s4).epsilon(1e-6));
}

TEST_CASE("router ties pick the lower expert index; an inconsistent RouterSpec is refused") {
  RouterSpec r;
  r.n_experts = 4;
  r.top_k = 2;
  CHECK(route(logits_row({1.0f, 1.0f, 1.0f, 1.0f}), r, Vec()).expert == std::vector<int>{0, 1});
  r.top_k = 5;
  CHECK_THROWS_WITH(route(logits_row({1.0f, 1.0f, 1.0f, 1.0f}), r, Vec()),
                    doctest::Contains("expected a consistent RouterSpec"));
}

TEST_CASE("MoE goldens: routing spreads over every expert of every MoE layer") {
  for (const std::string name : {"nemotron_h_moe_tiny", "qwen3_5_moe_tiny"}) {
    CAPTURE(name);
    const nlohmann::json meta = read_json_file(golden_dir(name) + "/golden.json");
    REQUIRE(meta.contains("routing"));
    const auto& counts = meta["routing"]["counts"];
    REQUIRE(counts.size() == (name == std::string("nemotron_h_moe_tiny") ? 2u : 3u));
    for (auto it = counts.begin(); it != counts.end(); ++it) {
      CAPTURE(it.key());
      const auto v = it.value().get<std::vector<int64_t>>();
      CHECK(v.size() == 8);
      int64_t total = 0;
      for (int64_t c : v) {
        CHECK(c > 0);
        total += c;
      }
      CHECK(total == 320 * 3);  // N tokens x top 3
      MESSAGE(name << " " << it.key() << ": min " << *std::min_element(v.begin(), v.end()) << ", max "
                   << *std::max_element(v.begin(), v.end()) << " of " << total);
    }
  }
}

TEST_CASE("MoE models: results independent of thread count and chunking") {
  for (const std::string name : {"nemotron_h_moe_tiny", "qwen3_5_moe_tiny"}) {
    CAPTURE(name);
    const CausalLM lm = CausalLM::load(golden_dir(name));
    const auto tokens = read_tokens(golden_dir(name) + "/tokens.npy");
    const Mat a = run(lm, tokens, 1), b = run(lm, tokens, 2), c = run(lm, tokens, 3, 37);
    CHECK((a.array() == b.array()).all());
    CHECK((a.array() == c.array()).all());
  }
}

// Bitwise, a row's output depends on which rows share its expert's product (Eigen's GEMM rounds a row
// differently with another row count, as torch's per-expert gather does): the forward keeps it fixed
// by cutting positions at fixed points, so the thread count changes nothing; other rows change a
// row only at float32 rounding.
TEST_CASE("MoE block: the thread count changes nothing; other rows change a row only at float32 rounding") {
  for (const std::string name : {"nemotron_h_moe_tiny", "qwen3_5_moe_tiny"}) {
    CAPTURE(name);
    const bool nemotron = name == std::string("nemotron_h_moe_tiny");
    const ModelConfig cfg = ModelConfig::load(golden_dir(name));
    TensorStore store(golden_dir(name));
    store.add_prefix_alias("backbone.", "model.");
    WeightLoader w(store, false);
    const MixtureOfExperts moe(w, nemotron ? "model.layers.1.mixer" : "model.layers.1.mlp", cfg.moe, cfg.hidden_size);
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Mat x(300, cfg.hidden_size);
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);
    Mat all, one, part;
    moe.forward(x, all, LayerContext{1, nullptr, 1});
    moe.forward(x, one, LayerContext{1, nullptr, 3});
    CHECK((all.array() == one.array()).all());
    CHECK(all.cwiseAbs().maxCoeff() > 0.1f);
    const Mat head = x.topRows(77), tail = x.bottomRows(200);
    moe.forward(head, part, LayerContext{1, nullptr, 2});
    CHECK_CLOSE(test::compare_close(part.data(), Mat(all.topRows(77)).data(), static_cast<std::size_t>(part.size()),
                                    {1e-5, 1e-5}, "first 77 rows alone vs among 300"));
    moe.forward(tail, part, LayerContext{1, nullptr, 2});
    CHECK_CLOSE(test::compare_close(part.data(), Mat(all.bottomRows(200)).data(), static_cast<std::size_t>(part.size()),
                                    {1e-5, 1e-5}, "last 200 rows alone vs among 300"));
    // 300 random rows spread over all 8 experts
    const Routing r = moe.route_rows(x, 2);
    std::vector<int> count(8, 0);
    for (const int e : r.expert) ++count[static_cast<std::size_t>(e)];
    CHECK(std::count(count.begin(), count.end(), 0) == 0);
  }
}

TEST_CASE("fused expert tensors (transformers' in-memory layout) load and give the same log-probs") {
  for (const std::string name : {"nemotron_h_moe_tiny", "qwen3_5_moe_tiny"}) {
    CAPTURE(name);
    TempDir tmp;
    const fs::path dir = tmp.path() / "m";
    copy_model(name, dir);
    RawTensors raw = read_safetensors_raw(dir / "model.safetensors"), fused;
    const bool nemotron = name == std::string("nemotron_h_moe_tiny");
    // Stack experts.{e}.X.weight into experts.X [E, rows, cols] (gate_up: gate rows, then up rows).
    std::map<std::string, std::vector<std::string>> parts;  // fused name -> bytes per expert
    for (auto& [n, t] : raw) {
      const auto at = n.find(".experts.");
      if (at == std::string::npos) {
        fused[n] = t;
        continue;
      }
      const std::string layer = n.substr(0, at), rest = n.substr(at + 9);
      const int e = std::stoi(rest.substr(0, rest.find('.')));
      const std::string proj = rest.substr(rest.find('.') + 1, rest.rfind('.') - rest.find('.') - 1);
      const std::string target = layer + ".experts." + (proj == "down_proj" ? "down_proj" : nemotron ? "up_proj" : "gate_up_proj");
      auto& v = parts[target];
      v.resize(8 * 2);
      v[static_cast<std::size_t>(2 * e + (proj == "up_proj" && !nemotron ? 1 : 0))] = t.bytes;
      auto& f = fused[target];
      f.dtype = t.dtype;
      const int64_t rows = t.shape[0] * (!nemotron && proj != "down_proj" ? 2 : 1);
      f.shape = {8, rows, t.shape[1]};
    }
    for (auto& [target, v] : parts) {
      std::string bytes;
      for (const auto& b : v) bytes += b;
      fused[target].bytes = bytes;
    }
    write_safetensors_raw(dir / "model.safetensors", fused);
    const auto tokens = read_tokens(golden_dir(name) + "/tokens.npy");
    const Mat want = run(CausalLM::load(golden_dir(name)), tokens, 2);
    const Mat got = run(CausalLM::load(dir.string()), tokens, 2);
    CHECK((want.array() == got.array()).all());
    CHECK(CausalLM::inspect(dir.string()).parameter_count() == CausalLM::inspect(golden_dir(name)).parameter_count());
  }
}

TEST_CASE("info states the forward's memory: weights once plus the largest activations") {
  const CausalLM lm = CausalLM::inspect(golden_dir("qwen3_5_moe_tiny"));
  const auto m0 = lm.forward_memory(0), m1 = lm.forward_memory(1000), m2 = lm.forward_memory(2000);
  // float32 golden: experts as stored (mapped) are 4 B per parameter too
  CHECK(m0.weight_bytes + m0.mapped_expert_bytes == 4 * 58344);
  CHECK(m1.weight_bytes == m0.weight_bytes);
  CHECK(m1.activation_bytes > 4 * 1000 * 3 * 32);
  CHECK(m2.activation_bytes > m1.activation_bytes);
  // hidden 32: GDN mixer W = conv 272 + 2 x 16 + 2 x 2 + 2 x 128 + 2 x (2 + 16) = 600 floats
  CHECK(m1.mixer_width == 600);
  const std::string d = lm.describe();
  CHECK(contains(d, "memory         weights 0.15 MiB (4 B x 39912 parameters"));
  CHECK(contains(d, "+ experts 0.07 MiB (18432 parameters as stored"));
  CHECK(contains(d, "N x (3 x hidden + W)"));
  CHECK(contains(d, "N = 131072"));
  CHECK(contains(d, "MoE            3 layers: 8 experts, top 3, softmax scores"));
}

TEST_CASE("MoE config fields are validated: the error names the file, the key and the expectation") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  const std::string cfg = (dir / "config.json").string();
  struct Case {
    const char* model;
    std::function<void(nlohmann::json&)> edit;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["n_routed_experts"] = 0; },
       "config key \"n_routed_experts\" is 0, expected a positive integer"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["num_experts_per_tok"] = 9; },
       "config key \"num_experts_per_tok\" is 9, expected at most n_routed_experts = 8"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["n_group"] = 3; },
       "config key \"n_group\" is 3, expected a divisor of n_routed_experts = 8"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["topk_group"] = 5; },
       "config key \"topk_group\" is 5, expected at most n_group = 4"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["n_group"] = 8; j["topk_group"] = 4; },
       "leaves 1 expert per group, expected at least 2"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["topk_group"] = 1; },
       "topk_group * (n_routed_experts / n_group) = 1 * 2 experts compete, expected at least num_experts_per_tok = 3"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["routed_scaling_factor"] = 0.0; },
       "config key \"routed_scaling_factor\" is 0, expected a finite number in (0, 1e6]"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["routed_scaling_factor"] = "Infinity"; },
       "config key \"routed_scaling_factor\" is inf"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["moe_intermediate_size"] = -4; },
       "config key \"moe_intermediate_size\" is -4, expected a positive integer"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["moe_shared_expert_intermediate_size"] = 0; },
       "config key \"moe_shared_expert_intermediate_size\" is 0"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["moe_latent_size"] = 0; },
       "config key \"moe_latent_size\" is 0, expected a positive integer"},
      {"nemotron_h_moe_tiny", [](nlohmann::json& j) { j["norm_topk_prob"] = "yes"; },
       "config key \"norm_topk_prob\" is \"yes\", expected true or false"},
      {"qwen3_5_moe_tiny", [](nlohmann::json& j) { j["num_experts"] = 2; },
       "config key \"num_experts_per_tok\" is 3, expected at most num_experts = 2"},
      {"qwen3_5_moe_tiny", [](nlohmann::json& j) { j.erase("moe_intermediate_size"); },
       "missing config key \"moe_intermediate_size\""},
      {"qwen3_5_moe_tiny", [](nlohmann::json& j) { j["shared_expert_intermediate_size"] = 0; },
       "config key \"shared_expert_intermediate_size\" is 0"},
      {"qwen3_5_moe_tiny", [](nlohmann::json& j) { j["norm_topk_prob"] = false; },
       "config key \"norm_topk_prob\" is false, but Qwen3.5-MoE (transformers 5.17) always renormalises"},
      {"qwen3_5_moe_tiny", [](nlohmann::json& j) { j["decoder_sparse_step"] = 2; },
       "config key \"decoder_sparse_step\" is 2, but every Qwen3.5-MoE layer is sparse"},
      {"qwen3_5_moe_tiny", [](nlohmann::json& j) { j["mlp_only_layers"] = {1}; },
       "config key \"mlp_only_layers\" is [1], but every Qwen3.5-MoE layer is sparse"},
  };
  for (const Case& c : cases) {
    const std::string expected = c.expected;
    CAPTURE(expected);
    copy_model(c.model, dir);
    edit_config(dir, c.edit);
    const std::string e = load_error(dir);
    CAPTURE(e);
    CHECK(contains(e, cfg));
    CHECK(contains(e, expected));
  }
  // Keys that agree with transformers 5.17's computation are accepted.
  copy_model("qwen3_5_moe_tiny", dir);
  edit_config(dir, [](nlohmann::json& j) {
    j["norm_topk_prob"] = true;
    j["decoder_sparse_step"] = 1;
    j["mlp_only_layers"] = nlohmann::json::array();
  });
  CHECK(load_error(dir) == "(no error)");
}

TEST_CASE("qwen3_5_moe (multimodal config): the text_config is read, prefixes as for qwen3_5") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  copy_model("qwen3_5_moe_tiny", dir);
  nlohmann::json inner = read_json_file((dir / "config.json").string()), outer;
  outer["model_type"] = "qwen3_5_moe";
  outer["text_config"] = inner;
  test::spit(dir / "config.json", outer.dump(2));
  RawTensors raw;
  for (auto& [n, t] : read_safetensors_raw(dir / "model.safetensors"))
    raw[n.rfind("model.", 0) == 0 ? "model.language_model." + n.substr(6) : n] = t;
  write_safetensors_raw(dir / "model.safetensors", raw);
  const auto tokens = read_tokens(golden_dir("qwen3_5_moe_tiny") + "/tokens.npy");
  CHECK((run(CausalLM::load(dir.string()), tokens, 2).array() ==
         run(CausalLM::load(golden_dir("qwen3_5_moe_tiny")), tokens, 2).array())
            .all());
  outer["text_config"]["num_experts_per_tok"] = 0;
  test::spit(dir / "config.json", outer.dump(2));
  CHECK(contains(load_error(dir), "config.json: text_config: config key \"num_experts_per_tok\" is 0"));
}

TEST_CASE("expert tensors: missing, misshapen or extra ones are refused naming the file and tensor") {
  TempDir tmp;
  const fs::path dir = tmp.path() / "m";
  const std::string st = (dir / "model.safetensors").string();
  SUBCASE("a missing expert") {
    copy_model("nemotron_h_moe_tiny", dir);
    RawTensors raw = read_safetensors_raw(dir / "model.safetensors");
    REQUIRE(raw.erase("backbone.layers.4.mixer.experts.5.down_proj.weight") == 1);
    write_safetensors_raw(dir / "model.safetensors", raw);
    const std::string e = load_error(dir);
    CHECK(contains(e, st));
    CHECK(contains(e, "missing tensor 'model.layers.4.mixer.experts.5.down_proj.weight' (expected shape [32, 16])"));
  }
  SUBCASE("an expert of the wrong shape") {
    copy_model("qwen3_5_moe_tiny", dir);
    RawTensors raw = read_safetensors_raw(dir / "model.safetensors");
    auto& t = raw.at("model.layers.2.mlp.experts.7.gate_proj.weight");
    t.shape = {16, 16};
    write_safetensors_raw(dir / "model.safetensors", raw);
    const std::string e = load_error(dir);
    CHECK(contains(e, st));
    CHECK(contains(e, "tensor 'model.layers.2.mlp.experts.7.gate_proj.weight' has shape [16, 16], expected [8, 32]"));
  }
  SUBCASE("an expert more than n_routed_experts") {
    copy_model("nemotron_h_moe_tiny", dir);
    RawTensors raw = read_safetensors_raw(dir / "model.safetensors");
    raw["backbone.layers.1.mixer.experts.8.up_proj.weight"] = raw.at("backbone.layers.1.mixer.experts.7.up_proj.weight");
    write_safetensors_raw(dir / "model.safetensors", raw);
    const std::string e = load_error(dir);
    CAPTURE(e);
    CHECK(contains(e, "backbone.layers.1.mixer.experts.8.up_proj.weight"));
    CHECK(contains(e, st));
  }
  SUBCASE("the router's correction bias missing") {
    copy_model("nemotron_h_moe_tiny", dir);
    RawTensors raw = read_safetensors_raw(dir / "model.safetensors");
    REQUIRE(raw.erase("backbone.layers.1.mixer.gate.e_score_correction_bias") == 1);
    write_safetensors_raw(dir / "model.safetensors", raw);
    CHECK(contains(load_error(dir), "missing tensor 'model.layers.1.mixer.gate.e_score_correction_bias' (expected shape [8])"));
  }
  SUBCASE("the shared expert gate of the wrong shape") {
    copy_model("qwen3_5_moe_tiny", dir);
    RawTensors raw = read_safetensors_raw(dir / "model.safetensors");
    raw.at("model.layers.0.mlp.shared_expert_gate.weight").shape = {32};
    write_safetensors_raw(dir / "model.safetensors", raw);
    CHECK(contains(load_error(dir), "tensor 'model.layers.0.mlp.shared_expert_gate.weight' has shape [32], expected [1, 32]"));
  }
  SUBCASE("a fused expert tensor of the wrong shape") {
    copy_model("nemotron_h_moe_tiny", dir);
    RawTensors raw = read_safetensors_raw(dir / "model.safetensors");
    std::string bytes;
    for (int e = 0; e < 8; ++e) {
      const std::string n = "backbone.layers.1.mixer.experts." + std::to_string(e) + ".up_proj.weight";
      bytes += raw.at(n).bytes;
      raw.erase(n);
    }
    raw["backbone.layers.1.mixer.experts.up_proj"] = test::RawTensor{"F32", {8, 32, 16}, bytes};
    write_safetensors_raw(dir / "model.safetensors", raw);
    CHECK(contains(load_error(dir), "tensor 'backbone.layers.1.mixer.experts.up_proj' has shape [8, 32, 16], expected [8, 16, 32]"));
  }
}
