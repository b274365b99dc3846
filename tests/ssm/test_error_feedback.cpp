// Error-feedback state quantization (+ef, not in the paper; asked for upstream as an alternative to
// stochastic rounding) in the CPU reference:
//  - the policy grammar takes '+ef' on every stored copy;
//  - quantize_state with a residual equals formats::fake_quantize_with_error_feedback bit for bit;
//  - the property that makes it interesting, against a float64 oracle: with a scalar decay a_t in
//    [0, 1] the stored state's error stays within two residuals, however slow the head. With e_t the
//    residual after write t, D_t = S^q_t - X_t = a_t D_{t-1} + e_{t-1} - e_t, so F_t = D_t + e_t obeys
//    F_t = a_t F_{t-1} + (1 - a_t) e_{t-1}, a convex combination: |F_t| <= max|e| and |D_t| <= 2 max|e|
//    (shared: the same with a_t the window's decay gamma). RTN on the same slow head stalls far from
//    the exact state (FP16, BF16, FP8; NVFP4's residual is as wide as that stall);
//  - the C.6 state-error measurement refuses it (its model is one RTN/SR rounding of the exact state).
// The emulator == literal decoders check for +ef policies is in test_emulator.cpp.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ssm/precision_policy.h"
#include "ssm/sequence_emulator.h"
#include "ssm/state_error.h"
#include "ssm/state_quantizer.h"
#include "ssm_test_data.h"

using namespace replayssm;
using namespace replayssm::ssm;
using formats::Rounding;
using formats::StorageFormat;

namespace {

// One Mamba-2 head whose state only grows: v, k > 0 on average and decays a in [a_lo, a_hi), the
// regime where RTN stalls (the increment falls below half a step of the stored state).
test::GroupData slow_positive_head(int n, int dk, int dv, float a_lo, float a_hi, uint64_t seed) {
  boost::random::mt19937_64 rng(seed);
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  boost::random::uniform_real_distribution<float> decay(a_lo, a_hi);
  test::GroupData d;
  d.shape = HeadGroupShape{Recurrence::mamba2, dk, dv, 1};
  d.n = n;
  d.q.resize(static_cast<std::size_t>(n) * dk);
  d.k.resize(static_cast<std::size_t>(n) * dk);
  d.alpha.assign(1, std::vector<float>(static_cast<std::size_t>(n)));
  d.v.assign(1, std::vector<float>(static_cast<std::size_t>(n) * dv));
  const float inv = 1.0f / std::sqrt(static_cast<float>(dk));
  for (auto& x : d.q) x = normal(rng) * inv;
  for (auto& x : d.k) x = (1.0f + 0.3f * normal(rng)) * inv;
  for (auto& x : d.v[0]) x = 1.0f + 0.3f * normal(rng);
  for (auto& a : d.alpha[0]) a = decay(rng);
  return d;
}

// The exact state X_t (float64) after every token.
std::vector<std::vector<double>> oracle_states(const test::GroupData& d) {
  const int dk = d.shape.dk, dv = d.shape.dv;
  std::vector<std::vector<double>> X(static_cast<std::size_t>(d.n));
  std::vector<double> S(static_cast<std::size_t>(dv) * dk, 0.0);
  for (int t = 0; t < d.n; ++t) {
    const float* k = &d.k[static_cast<std::size_t>(t) * dk];
    const float* v = &d.v[0][static_cast<std::size_t>(t) * dv];
    const double a = d.alpha[0][static_cast<std::size_t>(t)];
    for (int i = 0; i < dv; ++i)
      for (int c = 0; c < dk; ++c) S[i * dk + c] = a * S[i * dk + c] + double(v[i]) * k[c];
    X[static_cast<std::size_t>(t)] = S;
  }
  return X;
}

struct Deviation {
  double max_abs = 0.0;    // max over events and elements of |stored - exact|
  double max_state = 0.0;  // max |exact| at the events
};

// The stored recur copy after every quantization event against the exact state at that token.
Deviation stored_deviation(const test::GroupData& d, const PrecisionPolicy& p,
                           const std::vector<std::vector<double>>& X) {
  Deviation dev;
  EmulatorOptions o;
  o.on_checkpoint = [&](int, int64_t token, const float* recur, const float*) {
    const std::vector<double>& x = X[static_cast<std::size_t>(token)];
    for (std::size_t i = 0; i < x.size(); ++i) {
      dev.max_abs = std::max(dev.max_abs, std::fabs(double(recur[i]) - x[i]));
      dev.max_state = std::max(dev.max_state, std::fabs(x[i]));
    }
  };
  (void)test::run_emulator(d, p, {}, o);
  return dev;
}

}  // namespace

TEST_CASE("policy grammar: '+ef' on every stored copy, canonical form, uses_rounding") {
  for (const char* text : {"conv:fp16+ef", "shared:nvfp4+ef@16", "split:nvfp4+ef/fp32@16", "split:nvfp4+rtn/fp16+ef@8",
                           "split:fp8b128+ef/bf16+ef@4"}) {
    CAPTURE(text);
    const PrecisionPolicy p = PrecisionPolicy::parse(text);
    CHECK(p.to_string() == text);
    CHECK(PrecisionPolicy::parse(p.to_string()) == p);
    CHECK(p.uses_rounding(Rounding::ef));
    CHECK_FALSE(p.uses_rounding(Rounding::sr));
  }
  CHECK(PrecisionPolicy::parse("split:nvfp4+ef/fp16+sr@16").uses_rounding(Rounding::sr));
  CHECK_FALSE(PrecisionPolicy::parse("split:fp32/fp32@16").uses_rounding(Rounding::rtn));  // fp32 rounds nothing
  CHECK(test::error_of<std::invalid_argument>([] { (void)PrecisionPolicy::parse("conv:fp32+ef"); })
            .find("takes no rounding") != std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([] { (void)PrecisionPolicy::parse("conv:fp16+eff"); })
            .find("rtn, sr or ef") != std::string::npos);
}

TEST_CASE("quantize_state with a residual == fake_quantize_with_error_feedback, event after event") {
  boost::random::mt19937_64 rng(test::kBaseSeed * 1000 + 960);
  boost::random::normal_distribution<float> normal(0.0f, 2.0f);
  const int dv = 3, dk = 128;
  for (StorageFormat f : {StorageFormat::fp16, StorageFormat::bf16, StorageFormat::e4m3, StorageFormat::e2m1,
                          StorageFormat::fp8b128, StorageFormat::nvfp4}) {
    CAPTURE(formats::to_string(f));
    const StateFormat sf{f, Rounding::ef};
    StateMatrix residual = error_feedback_residual(sf, dv, dk);
    REQUIRE(residual.rows() == dv);
    CHECK(residual.isZero(0.0f));
    CHECK(error_feedback_residual(StateFormat{f, Rounding::sr}, dv, dk).size() == 0);
    std::vector<float> ref_residual(static_cast<std::size_t>(dv) * dk, 0.0f);
    for (int event = 0; event < 6; ++event) {
      StateMatrix S(dv, dk);
      for (int i = 0; i < S.size(); ++i) S.data()[i] = normal(rng);
      std::vector<float> ref(S.data(), S.data() + S.size());
      formats::fake_quantize_with_error_feedback(ref.data(), ref_residual.data(), dv, dk, f);
      quantize_state(S, sf, 5, HeadGroupId{1, 2}, 0, CheckpointCopy::recur, static_cast<uint64_t>(event), residual);
      CHECK(std::memcmp(S.data(), ref.data(), ref.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(residual.data(), ref_residual.data(), ref.size() * sizeof(float)) == 0);
    }
    StateMatrix S = StateMatrix::Ones(dv, dk);
    CHECK(test::error_of<std::invalid_argument>([&] {
            quantize_state(S, sf, 0, HeadGroupId{}, 0, CheckpointCopy::recur, 0);  // no residual given
          }).find("error feedback") != std::string::npos);
    StateMatrix wrong = StateMatrix::Zero(dv, dk / 2);
    CHECK_THROWS_AS(quantize_state(S, sf, 0, HeadGroupId{}, 0, CheckpointCopy::recur, 0, wrong), std::logic_error);
  }
}

TEST_CASE("error feedback keeps a slow head's stored state within two residuals of the exact one (float64 oracle)") {
  uint64_t seed = test::kBaseSeed * 1000 + 980;
  std::printf("\n[error feedback] slow positive Mamba-2 head: max |stored - exact| / max |exact|\n");
  struct Case {
    const char* ef;
    const char* rtn;
    const char* sr;
    StorageFormat format;
    int n;
  };
  for (const Case c : {Case{"conv:bf16+ef", "conv:bf16+rtn", "conv:bf16+sr,seed=3", StorageFormat::bf16, 6000},
                       Case{"conv:fp16+ef", "conv:fp16+rtn", "conv:fp16+sr,seed=3", StorageFormat::fp16, 6000},
                       Case{"shared:bf16+ef@8", "shared:bf16+rtn@8", "shared:bf16+sr@8,seed=3", StorageFormat::bf16,
                            20000},
                       Case{"shared:fp8b128+ef@16", "shared:fp8b128+rtn@16", "shared:fp8b128+sr@16,seed=3",
                            StorageFormat::fp8b128, 20000},
                       Case{"shared:nvfp4+ef@16", "shared:nvfp4+rtn@16", "shared:nvfp4+sr@16,seed=3",
                            StorageFormat::nvfp4, 20000}}) {
    CAPTURE(c.ef);
    const test::GroupData d = slow_positive_head(c.n, 128, 2, 0.998f, 0.9995f, ++seed);
    const auto X = oracle_states(d);
    const Deviation ef = stored_deviation(d, PrecisionPolicy::parse(c.ef), X);
    const Deviation rtn = stored_deviation(d, PrecisionPolicy::parse(c.rtn), X);
    const Deviation sr = stored_deviation(d, PrecisionPolicy::parse(c.sr), X);
    const Deviation fp32 = stored_deviation(d, PrecisionPolicy::parse("conv:fp32"), X);  // arithmetic alone
    // A residual is at most half a step of the value quantized: 2^-11 (fp16) or 2^-8 (bf16) of it
    // relative, for NVFP4 half of the largest E2M1 gap (2 of 6) times the block scale, i.e. 1/6 of
    // the block's largest value, which is at most the largest |state| plus a residual.
    const double rel = c.format == StorageFormat::fp16      ? std::ldexp(1.0, -11)
                       : c.format == StorageFormat::bf16    ? std::ldexp(1.0, -8)
                       : c.format == StorageFormat::fp8b128 ? std::ldexp(1.0, -4)
                                                            : 1.0 / 6.0;
    const double residual_bound = rel * ef.max_state * (1.0 + 2.0 * rel);
    const double bound = 2.0 * residual_bound + 2.0 * fp32.max_abs;
    std::printf("  %-20s ef %.2e  rtn %.2e  sr %.2e  (bound for ef %.2e; fp32 arithmetic %.1e)\n", c.ef,
                ef.max_abs / ef.max_state, rtn.max_abs / rtn.max_state, sr.max_abs / sr.max_state,
                bound / ef.max_state, fp32.max_abs / fp32.max_state);
    CHECK(ef.max_abs <= bound);
    // The test can tell: on this head RTN breaks the bound. Not for NVFP4, whose residual (up to a
    // sixth of the block's largest value) makes the two-residual bound as wide as RTN's stall: there
    // the bound is all that is claimed (the KL sweeps measure the rest).
    if (c.format != StorageFormat::nvfp4) CHECK(rtn.max_abs > bound);
  }
}

TEST_CASE("the appendix C.6 state-error measurement refuses error feedback") {
  CHECK(test::error_of<std::invalid_argument>([] {
          check_state_error_policy(PrecisionPolicy::parse("shared:nvfp4+ef@16"));
        }).find("error feedback") != std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([] {
          check_state_error_policy(PrecisionPolicy::parse("split:nvfp4+rtn/fp16+ef@16"));
        }).find("+rtn or +sr") != std::string::npos);
  CHECK_NOTHROW(check_state_error_policy(PrecisionPolicy::parse("shared:nvfp4+sr@16")));
}
