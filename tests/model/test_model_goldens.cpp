// Our CPU forward against transformers (goldens made by scripts/make_goldens.py with
// transformers' own classes), and the effect of precision policies on the same checkpoints.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

#include "io/npy.h"
#include "model/causal_lm.h"
#include "model/json_util.h"
#include "model/teacher_forced_model.h"
#include "test_model_util.h"

using namespace replayssm;
using namespace replayssm::model;
using replayssm::test::golden_dir;
using replayssm::test::golden_models;
using replayssm::test::read_tokens;

namespace {

// Tolerance of the FP32 forward vs transformers' FP32 forward, per log-probability (the comparison
// rule of test_util.h): |ours - ref| <= kRelTol (1 + |ref|). Both sit at float32 rounding from a
// float64 forward (measured: max 1.3e-5 relative, 7.3e-5 absolute, qwen3_5_tiny).
constexpr double kRelTol = 1e-4;

test::Closeness compare_logprobs(const Mat& got, const Mat& ref, double tol, const std::string& what) {
  if (got.rows() != ref.rows() || got.cols() != ref.cols()) {
    test::Closeness c;
    c.what = what;
    c.count = c.mismatches = static_cast<std::size_t>(std::max(got.size(), ref.size()));
    c.first.push_back("shapes differ");
    return c;
  }
  return test::compare_close(got.data(), ref.data(), static_cast<std::size_t>(ref.size()), {tol, tol}, what);
}
double max_abs_difference(const Mat& a, const Mat& b) { return compare_logprobs(a, b, 0.0, "").max_abs; }

// KL(p_ref || p_other) per position from log-probabilities: a measurement (mean and max over positions).
struct KlSummary {
  double mean = 0, max = 0;
};
KlSummary kl_summary(const Mat& ref, const Mat& other) {
  KlSummary s;
  for (Eigen::Index t = 0; t < ref.rows(); ++t) {
    double kl = 0;
    for (Eigen::Index j = 0; j < ref.cols(); ++j) kl += std::exp(double(ref(t, j))) * (double(ref(t, j)) - other(t, j));
    s.mean += kl / static_cast<double>(ref.rows());
    s.max = std::max(s.max, kl);
  }
  return s;
}

struct Golden {
  CausalLM lm;
  std::vector<int64_t> tokens;
  Mat ref;
  nlohmann::json meta;
};

const Golden& golden(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Golden>> cache;
  auto& g = cache[name];
  if (!g) {
    const std::string dir = golden_dir(name);
    const io::NpyArray lp = io::read_npy_float32(dir + "/logprobs.npy");
    g = std::unique_ptr<Golden>(new Golden{
        CausalLM::load(dir), read_tokens(dir + "/tokens.npy"),
        Eigen::Map<const Mat>(reinterpret_cast<const float*>(lp.data.data()), static_cast<Eigen::Index>(lp.shape[0]),
                              static_cast<Eigen::Index>(lp.shape[1])),
        read_json_file(dir + "/golden.json")});
  }
  return *g;
}

Mat run(const Golden& g, const std::string& policy, int threads = 2) {
  ForwardOptions o;
  o.threads = threads;
  return g.lm.log_probs(g.tokens, ssm::PrecisionPolicy::parse(policy), o);
}

}  // namespace

TEST_CASE("FP32 forward (conv:fp32) matches transformers on every golden architecture") {
  for (const std::string& name : golden_models()) {
    CAPTURE(name);
    const Golden& g = golden(name);
    REQUIRE(g.meta.contains("transformers_version"));
    REQUIRE(g.meta.contains("torch_version"));
    CHECK(g.lm.parameter_count() == g.meta["parameters"].get<std::size_t>());
    CHECK(g.lm.config().model_type == g.meta["model_type"].get<std::string>());
    REQUIRE(g.ref.rows() == static_cast<Eigen::Index>(g.tokens.size()));
    REQUIRE(g.ref.cols() == g.lm.vocab_size());
    const Mat ours = run(g, "conv:fp32");
    const test::Closeness close = compare_logprobs(ours, g.ref, kRelTol, name + " vs transformers");
    const KlSummary kl = kl_summary(g.ref, ours);
    MESSAGE(name << " vs transformers " << g.meta["transformers_version"].get<std::string>() << " (torch "
                 << g.meta["torch_version"].get<std::string>() << "): max |dlogp| " << close.max_abs
                 << ", max |d|/allowed " << close.max_excess << ", mean KL " << kl.mean);
    CHECK_CLOSE(close);
    // KL from float32 log-probs carries ~1e-7 of rounding noise (the rows' exp do not sum to 1 exactly).
    CHECK(std::abs(kl.max) < 1e-6);
  }
}

TEST_CASE("FP32 replay (shared:fp32@16) equals conventional FP32 to float32 rounding") {
  for (const std::string& name : golden_models()) {
    CAPTURE(name);
    const Golden& g = golden(name);
    const Mat conv = run(g, "conv:fp32"), replay = run(g, "shared:fp32@16");
    CHECK_CLOSE(compare_logprobs(replay, conv, 1e-5, name + ": shared:fp32@16 vs conv:fp32"));
    CHECK(std::abs(kl_summary(conv, replay).max) < 1e-9);
  }
}

TEST_CASE("low-precision state policies change the log-probabilities measurably") {
  for (const std::string& name : golden_models()) {
    CAPTURE(name);
    const Golden& g = golden(name);
    const Mat fp32 = run(g, "conv:fp32");
    for (const std::string policy : {"shared:nvfp4+rtn@16", "conv:fp16+rtn"}) {
      CAPTURE(policy);
      const Mat lp = run(g, policy);
      const double max_abs = max_abs_difference(lp, fp32);
      const KlSummary kl = kl_summary(fp32, lp);
      MESSAGE(name << " " << policy << ": max |dlogp| " << max_abs << ", mean KL " << kl.mean);
      CHECK(max_abs > 1e-3);  // far above the 1e-5-level FP32 noise
      CHECK(kl.mean > 1e-8);
    }
  }
}

TEST_CASE("results do not depend on thread count or chunking; variants stream together") {
  const Golden& g = golden("qwen3_5_tiny");
  const std::string sr = "conv:bf16+sr,seed=7";
  const Mat a = run(g, sr, 1), b = run(g, sr, 2), c = run(g, sr, 3);
  CHECK((a.array() == b.array()).all());
  CHECK((a.array() == c.array()).all());

  // Two variants in one pass, odd chunk size, raw logits: each chunk row equals the separate runs.
  ForwardOptions o;
  o.threads = 2;
  o.chunk_positions = 37;
  const Mat fp32 = run(g, "conv:fp32");
  std::size_t seen = 0, chunks = 0;
  g.lm.forward(g.tokens, {ssm::PrecisionPolicy::parse("conv:fp32"), ssm::PrecisionPolicy::parse(sr)}, o,
               [&](const LogitsChunk& ch) {
                 REQUIRE(ch.rows.size() == 2);
                 CHECK(ch.begin == seen);
                 CHECK(ch.count <= 37);
                 const Eigen::Map<const Mat> r0(ch.rows[0], static_cast<Eigen::Index>(ch.count), ch.vocab);
                 const Eigen::Map<const Mat> r1(ch.rows[1], static_cast<Eigen::Index>(ch.count), ch.vocab);
                 CHECK((r0.array() == fp32.middleRows(static_cast<Eigen::Index>(ch.begin), r0.rows()).array()).all());
                 CHECK((r1.array() == a.middleRows(static_cast<Eigen::Index>(ch.begin), r1.rows()).array()).all());
                 seen += ch.count;
                 ++chunks;
               });
  CHECK(seen == g.tokens.size());
  CHECK(chunks == (g.tokens.size() + 36) / 37);

  // Raw logits: log_softmax of them gives the log-probs.
  o.log_softmax = false;
  const Mat logits = g.lm.log_probs(g.tokens, ssm::PrecisionPolicy::parse("conv:fp32"), o);
  for (Eigen::Index t = 0; t < logits.rows(); t += 53) {
    const double mx = logits.row(t).maxCoeff();
    const double lse = mx + std::log((logits.row(t).array().cast<double>() - mx).exp().sum());
    CHECK(std::abs((logits(t, 3) - lse) - fp32(t, 3)) < 1e-5);
  }
}

TEST_CASE("per-layer policy overrides touch only their layer") {
  const Golden& g = golden("nemotron_h_tiny");  // pattern M*-M-*: SSM layers 0 and 3
  PolicyAssignment p(ssm::PrecisionPolicy::parse("conv:fp32"));
  p.per_layer[3] = ssm::PrecisionPolicy::parse("shared:nvfp4+rtn@16");
  CHECK(&p.for_layer(0) == &p.all);
  CHECK(p.for_layer(3).window == 16);
  ForwardOptions o;
  o.threads = 2;
  const Mat mixed = g.lm.log_probs(g.tokens, p, o);
  const Mat fp32 = run(g, "conv:fp32"), all_lp = run(g, "shared:nvfp4+rtn@16");
  CHECK(max_abs_difference(mixed, fp32) > 1e-4);
  CHECK(max_abs_difference(mixed, all_lp) > 1e-4);
}

TEST_CASE("token ids outside the vocabulary are rejected with their position") {
  const Golden& g = golden("mamba2_tiny");
  std::vector<int64_t> t = {1, 2, 256, 3};
  CHECK_THROWS_WITH(g.lm.log_probs(t, ssm::PrecisionPolicy::parse("conv:fp32")),
                    doctest::Contains("token 256 at position 2 is outside the vocabulary [0, 256)"));
  t[2] = -1;
  CHECK_THROWS_WITH(g.lm.log_probs(t, ssm::PrecisionPolicy::parse("conv:fp32")), doctest::Contains("position 2"));
}

TEST_CASE("model::load_teacher_forced_model: hidden states + LM head on slices give the same log-probs") {
  const Golden& g = golden("nemotron_h_tiny");
  auto m = model::load_teacher_forced_model(golden_dir("nemotron_h_tiny"));
  CHECK(m->vocab_size() == 256);
  CHECK(m->hidden_size() == 64);
  CHECK(m->description().find("M*-M-*") != std::string::npos);
  const std::string h = m->content_hash();
  CHECK(h.size() == 16);
  CHECK(h == m->content_hash());
  CHECK(h == model::load_teacher_forced_model(golden_dir("nemotron_h_tiny"))->content_hash());
  CHECK(h != model::load_teacher_forced_model(golden_dir("mamba2_tiny"))->content_hash());
  const std::vector<int32_t> ids(g.tokens.begin(), g.tokens.end());
  const auto policy = ssm::PrecisionPolicy::parse("shared:nvfp4+rtn@16");
  const model::RowMatrixXf hidden = m->final_hidden(ids, policy);
  REQUIRE(hidden.rows() == static_cast<Eigen::Index>(ids.size()));
  const Mat want = run(g, "shared:nvfp4+rtn@16");
  for (Eigen::Index b = 0; b < hidden.rows(); b += 100) {
    const Eigen::Index rows = std::min<Eigen::Index>(100, hidden.rows() - b);
    const model::RowMatrixXf lp = m->log_probs(hidden.middleRows(b, rows));
    CHECK((lp.array() == want.middleRows(b, rows).array()).all());
  }
}
