// The GPU teacher-forced forward (cuda/model/gpu_causal_lm.h) against the CPU's (model::CausalLM) on
// every bundled and golden model that loads (test_model_util.h golden_models(), data/models/tiny_*),
// on the first 300 tokens (the golden token files; the byte-level trained models read a fixed
// English text as bytes):
//   FP32 policies   final hidden states |d| <= 1e-5 (rms + |cpu|); log-probs |d| <= 1e-5 (1 + |cpu|)
//   quantized       the per-position KL(p_fp32 || p_policy) of GPU and CPU: means within 4 block
//                   standard errors, KL(CPU || GPU) <= 3 x the CPU's KL (rounding decisions flipped
//                   by the different FP32 summation order make the runs two noise realisations;
//                   see the test case); relative difference and correlation printed
//   bf16x3 / bf16   GEMM compute: KL against the CPU's FP32 forward printed, bf16x3 below bf16
// Every one of them has a GPU twin (Kimi Linear's KDA and MLA and the MoE layers included: their blocks
// are tested one by one in test_kimi_blocks_cuda); the refusal path of unsupported_reason() is tested
// with a model opened by inspect() (no weights: the one kind of bundled model the GPU cannot run).
// Skips (77) without a GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "eval/kl_metrics.h"
#include "model/causal_lm.h"
#include "model/gpu_causal_lm.h"
#include "model/moe.h"
#include "../model/test_model_util.h"
#include "gpu_test_util.h"

using namespace replayssm;
using namespace replayssm::cuda;
using model::Mat;

namespace {

const test::GpuGuard gpu_guard("GPU model tests");

constexpr std::size_t kTokens = 300;


std::vector<std::string> models() {
  std::vector<std::string> m = test::golden_models();
  for (const char* extra : {"tiny_mamba2", "tiny_qwen3_5"})
    if (std::filesystem::exists(test::golden_dir(extra) + "/config.json")) m.push_back(extra);
  return m;
}

std::vector<int64_t> tokens_of(const std::string& name) {
  const std::string file = test::golden_dir(name) + "/tokens.npy";
  std::vector<int64_t> t;
  if (std::filesystem::exists(file)) {
    t = test::read_tokens(file);
  } else {
    for (const char* c = test::kEnglishText; *c; ++c) t.push_back(static_cast<unsigned char>(*c));
  }
  REQUIRE(t.size() >= kTokens);
  t.resize(kTokens);
  return t;
}

// Row-wise log-softmax in double, as CausalLM::lm_head computes it.
Mat log_softmax(const std::vector<float>& logits, Eigen::Index rows, Eigen::Index vocab) {
  Mat out(rows, vocab);
  for (Eigen::Index r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * vocab;
    float mx = -INFINITY;
    for (Eigen::Index j = 0; j < vocab; ++j) mx = std::max(mx, row[j]);
    double sum = 0.0;
    for (Eigen::Index j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
    const double lse = mx + std::log(sum);
    for (Eigen::Index j = 0; j < vocab; ++j) out(r, j) = static_cast<float>(static_cast<double>(row[j]) - lse);
  }
  return out;
}

struct GpuResult {
  Mat hidden, logprobs;
};
GpuResult run_gpu(const GpuCausalLM& g, const std::vector<int64_t>& tokens, const model::PolicyAssignment& policy) {
  const std::vector<int32_t> ids(tokens.begin(), tokens.end());
  const int64_t n = static_cast<int64_t>(ids.size());
  DeviceMatrixBuffer hidden(n, g.hidden_size()), logits(n, g.vocab_size());
  g.final_hidden(ids, policy, hidden.view());
  g.lm_logits(hidden.view(), logits.view());
  REPLAYSSM_CUDA_CHECK(cudaStreamSynchronize(g.stream()));
  const std::vector<float> h = to_host(hidden.view()), l = to_host(logits.view());
  GpuResult r;
  r.hidden = Eigen::Map<const Mat>(h.data(), n, g.hidden_size());
  r.logprobs = log_softmax(l, n, g.vocab_size());
  return r;
}

Mat run_cpu(const model::CausalLM& lm, const std::vector<int64_t>& tokens, const std::string& policy) {
  model::ForwardOptions o;
  o.threads = 2;
  return lm.log_probs(tokens, ssm::PrecisionPolicy::parse(policy), o);
}

// KL(p || q) per position from log-probabilities.
// Per-position KL(p || q) of two log-prob matrices by the sweep's own comparison (eval/kl_metrics.h:
// renormalised in double, accurate to ~1e-15 relative, so KLs of 1e-9 between states are resolved;
// a plain sum of exp(p) (p - q) over float32 rows is off by ~1e-9 from their normalisation alone).
std::vector<double> kl_rows(const Mat& p, const Mat& q) {
  std::vector<eval::PositionResult> r(static_cast<std::size_t>(p.rows()));
  const std::vector<int32_t> no_targets(r.size(), -1);
  eval::compare_positions(p.data(), q.data(), p.rows(), static_cast<int>(p.cols()), p.cols(), no_targets.data(),
                          r.data(), 2);
  std::vector<double> kl;
  for (const auto& x : r) kl.push_back(x.kl);
  return kl;
}
double mean(const std::vector<double>& v) {
  double s = 0;
  for (const double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}
// Standard error of mean(b - a) from the means of consecutive blocks of `block` positions (the
// per-position KLs of neighbouring positions are correlated).
double block_standard_error(const std::vector<double>& a, const std::vector<double>& b, std::size_t block) {
  std::vector<double> means;
  for (std::size_t i = 0; i + block <= a.size(); i += block) {
    double s = 0;
    for (std::size_t j = i; j < i + block; ++j) s += b[j] - a[j];
    means.push_back(s / static_cast<double>(block));
  }
  const double m = mean(means);
  double ss = 0;
  for (const double x : means) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(means.size() - 1) / static_cast<double>(means.size()));
}
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const double ma = mean(a), mb = mean(b);
  double sab = 0, saa = 0, sbb = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  return sab / std::sqrt(saa * sbb);
}

const model::CausalLM& cpu_model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<model::CausalLM>> cache;
  auto& m = cache[name];
  if (!m) m = std::make_unique<model::CausalLM>(model::CausalLM::load(test::golden_dir(name)));
  return *m;
}

}  // namespace

TEST_CASE("every bundled and golden model runs on the GPU; an inspect()ed model is refused with the reason") {
  for (const std::string& name : models()) {
    CAPTURE(name);
    const model::CausalLM& lm = cpu_model(name);
    const std::string reason = GpuCausalLM::unsupported_reason(lm);
    INFO(name << ": unsupported_reason = \"" << reason << "\"");
    CHECK(reason.empty());
    // Opened without weights: refused, and the constructor throws the reason with the directory.
    const model::CausalLM shapes = model::CausalLM::inspect(test::golden_dir(name));
    const std::string refused = GpuCausalLM::unsupported_reason(shapes);
    CHECK(test::contains(refused, "inspect()"));
    const std::string error =
        test::error_of<std::runtime_error>([&] { const GpuCausalLM g(shapes, GemmPrecision::fp32); });
    CHECK(test::contains(error, refused));
    CHECK(test::contains(error, shapes.directory()));
  }
}

TEST_CASE("FP32 policies: GPU final hidden states and log-probs equal the CPU's to 1e-5") {
  for (const std::string& name : models()) {
    CAPTURE(name);
    const model::CausalLM& lm = cpu_model(name);
    const std::vector<int64_t> tokens = tokens_of(name);
    const GpuCausalLM g(lm, GemmPrecision::fp32);
    CHECK(g.vocab_size() == lm.vocab_size());
    CHECK(g.hidden_size() == lm.config().hidden_size);
    for (const std::string policy : {"conv:fp32", "shared:fp32@16"}) {
      CAPTURE(policy);
      const GpuResult gpu = run_gpu(g, tokens, ssm::PrecisionPolicy::parse(policy));
      const Mat hidden = lm.final_hidden(tokens, ssm::PrecisionPolicy::parse(policy), 2);
      const Mat lp = run_cpu(lm, tokens, policy);
      const double h_rms = test::rms(hidden.data(), static_cast<std::size_t>(hidden.size()));
      const test::Closeness ch = test::compare_close(gpu.hidden.data(), hidden.data(),
                                                     static_cast<std::size_t>(hidden.size()), {1e-5 * h_rms, 1e-5},
                                                     name + " " + policy + " final hidden");
      const test::Closeness cl = test::compare_close(gpu.logprobs.data(), lp.data(), static_cast<std::size_t>(lp.size()),
                                                     {1e-5, 1e-5}, name + " " + policy + " log-probs");
      MESSAGE(name << " " << policy << ": hidden max |d| " << ch.max_abs << " (rms " << h_rms << "), log-probs max |d| "
                   << cl.max_abs << ", max |d|/allowed " << cl.max_excess << ", mean KL(cpu||gpu) "
                   << mean(kl_rows(lp, gpu.logprobs)));
      CHECK_CLOSE(ch);
      CHECK_CLOSE(cl);
    }
  }
}

TEST_CASE("quantized policies: the GPU's KL against FP32 follows the CPU's per position") {
  for (const std::string& name : models()) {
    CAPTURE(name);
    const model::CausalLM& lm = cpu_model(name);
    const std::vector<int64_t> tokens = tokens_of(name);
    const GpuCausalLM g(lm, GemmPrecision::fp32);
    const Mat cpu_ref = run_cpu(lm, tokens, "conv:fp32");
    const Mat gpu_ref = run_gpu(g, tokens, ssm::PrecisionPolicy::parse("conv:fp32")).logprobs;
    for (const std::string policy :
         {"split:nvfp4/fp32@16", "shared:fp16@8", "conv:bf16", "shared:nvfp4+sr@16,seed=3", "conv:fp16+sr,seed=5"}) {
      CAPTURE(policy);
      const Mat cpu_q = run_cpu(lm, tokens, policy);
      const Mat gpu_q = run_gpu(g, tokens, ssm::PrecisionPolicy::parse(policy)).logprobs;
      const std::vector<double> kl_cpu = kl_rows(cpu_ref, cpu_q), kl_gpu = kl_rows(gpu_ref, gpu_q);
      const double m_cpu = mean(kl_cpu), m_gpu = mean(kl_gpu), cross = mean(kl_rows(cpu_q, gpu_q));
      const double corr = correlation(kl_cpu, kl_gpu), se = block_standard_error(kl_cpu, kl_gpu, 16);
      MESSAGE(name << " " << policy << ": mean KL(fp32||policy) cpu " << m_cpu << ", gpu " << m_gpu << " (rel diff "
                   << std::abs(m_gpu - m_cpu) / m_cpu << ", " << (m_gpu - m_cpu) / se
                   << " standard errors), per-position correlation " << corr << ", mean KL(cpu||gpu) " << cross);
      // The GPU's scans are bit-identical to the CPU's on the same inputs (test_sequence_scan_cuda);
      // in a model their inputs differ by the non-recurrent layers' FP32 rounding (~1e-6), which
      // flips some rounding decisions of the state quantizer, and a flipped decision propagates
      // through the recurrence: the two runs are two realisations of the quantization noise, not
      // one. So the test is statistical: the mean KL of the GPU run lies within 4 standard errors
      // (blocks of 16 positions) of the CPU's, and the two runs are no farther apart than two
      // independent realisations would be (KL(cpu||gpu) <= 3 x the KL each has from FP32).
      CHECK(m_cpu > 0);
      CHECK(std::abs(m_gpu - m_cpu) <= 4 * se);
      CHECK(cross <= 3 * m_cpu);
    }
  }
}

TEST_CASE("bf16x3 and bf16 GEMM compute: KL against the CPU's FP32 forward, bf16x3 the closer") {
  for (const std::string& name : models()) {
    CAPTURE(name);
    const model::CausalLM& lm = cpu_model(name);
    const std::vector<int64_t> tokens = tokens_of(name);
    const Mat ref = run_cpu(lm, tokens, "conv:fp32");
    double kl[2] = {0, 0};
    for (const GemmPrecision p : {GemmPrecision::bf16x3, GemmPrecision::bf16}) {
      const GpuCausalLM g(lm, p);
      CHECK(g.gemm_precision() == p);
      const Mat lp = run_gpu(g, tokens, ssm::PrecisionPolicy::parse("conv:fp32")).logprobs;
      kl[p == GemmPrecision::bf16 ? 1 : 0] = mean(kl_rows(ref, lp));
    }
    MESSAGE(name << ": mean KL(cpu fp32 || gpu) with bf16x3 GEMMs " << kl[0] << ", with bf16 GEMMs " << kl[1]);
    CHECK(kl[0] < kl[1]);
    CHECK(std::abs(kl[0]) < 1e-5);
  }
}

TEST_CASE("token ids are checked on the host; memory plan; empty input") {
  const model::CausalLM& lm = cpu_model("mamba2_tiny");
  const GpuCausalLM g(lm, GemmPrecision::fp32);
  DeviceMatrixBuffer out(4, g.hidden_size());
  const std::vector<int32_t> bad = {1, 2, 256, 3};
  CHECK_THROWS_WITH_AS(g.final_hidden(bad, ssm::PrecisionPolicy::parse("conv:fp32"), out.view()),
                       doctest::Contains("token 256 at position 2 is outside the vocabulary [0, 256)"),
                       std::invalid_argument);
  const std::vector<int32_t> neg = {1, -1, 2, 3};
  CHECK_THROWS_WITH_AS(g.final_hidden(neg, ssm::PrecisionPolicy::parse("conv:fp32"), out.view()),
                       doctest::Contains("position 1"), std::invalid_argument);
  DeviceMatrixBuffer wrong(3, g.hidden_size());
  CHECK_THROWS_AS(g.final_hidden(std::vector<int32_t>{1, 2, 3, 4}, ssm::PrecisionPolicy::parse("conv:fp32"), wrong.view()),
                  std::invalid_argument);
  DeviceMatrixBuffer none(0, g.hidden_size());
  g.final_hidden(std::vector<int32_t>{}, ssm::PrecisionPolicy::parse("conv:fp32"), none.view());

  // Mamba-2 only: every parameter is uploaded once as float32 (the stacked projections hold the same values).
  const GpuMemoryPlan p = g.memory_plan(kTokens);
  CHECK(p.weight_bytes == 4 * static_cast<int64_t>(lm.parameter_count()));
  CHECK(p.activation_bytes == 4 * (2 * int64_t{kTokens} * g.hidden_size() + int64_t{kTokens}));
  CHECK(p.scratch_bytes > 0);
  CHECK(g.memory_plan(2 * kTokens).scratch_bytes == 2 * p.scratch_bytes);
  const GpuCausalLM g3(lm, GemmPrecision::bf16x3);
  CHECK(g3.memory_plan(kTokens).weight_bytes > p.weight_bytes);  // + the BF16 parts
}

TEST_CASE("memory plan of the Kimi Linear and MoE models: every parameter uploaded once as float32, experts included") {
  for (const std::string name : {"kimi_linear_tiny", "nemotron_h_moe_tiny", "qwen3_5_moe_tiny"}) {
    CAPTURE(name);
    const model::CausalLM& lm = cpu_model(name);
    // The router's correction bias stays on the host (model::route reads it there).
    int64_t host_only = 0, moe_layers = 0;
    for (const auto& L : lm.layer_blocks())
      for (const model::Block* b : {L.mixer.get(), L.mlp.get()})
        if (const auto* m = dynamic_cast<const model::MixtureOfExperts*>(b)) {
          host_only += m->correction_bias().size();
          ++moe_layers;
        }
    CHECK(moe_layers > 0);
    const GpuCausalLM g(lm, GemmPrecision::fp32);
    const GpuMemoryPlan p = g.memory_plan(kTokens);
    MESSAGE(name << ": weights " << p.weight_bytes << " B for " << lm.parameter_count() << " parameters ("
                 << host_only << " on the host), scratch " << p.scratch_bytes << " B at " << kTokens << " positions");
    CHECK(p.weight_bytes == 4 * (static_cast<int64_t>(lm.parameter_count()) - host_only));
    CHECK(p.scratch_bytes > 0);
    CHECK(g.memory_plan(2 * kTokens).scratch_bytes > p.scratch_bytes);
  }
}
