// The stored-state error of ssm/state_error.h (issue 11, appendix C.6 on real states): measured
// against the FP32 states of the same inputs, beside the section 6 error model.
//   - split with an FP32 recur copy: the LP copy is exactly one rounding of the exact state, on the
//     same stream, so measured and predicted mean squares must agree to float64 rounding, for every
//     recurrence, format and rounding;
//   - shared, SR, Mamba-2 (the recurrence carries the error exactly by gamma): the measured mean
//     square matches sigma^2 / (1 - E[gamma^2]) within its sampling error, and is far from one rounding;
//   - RTN's repeated errors lie between the independent model and the coherent bound.
#include <doctest/doctest.h>

#include <cmath>

#include "ssm/state_error.h"
#include "ssm_test_data.h"
#include "test_util.h"

using namespace replayssm;

TEST_CASE("state error: split with an FP32 recur copy measures exactly one rounding of the exact state") {
  uint64_t seed = test::kBaseSeed + 1101;
  for (const auto kind : {ssm::Recurrence::mamba2, ssm::Recurrence::gdn, ssm::Recurrence::kda}) {
    for (const char* text : {"split:nvfp4+rtn/fp32@16", "split:nvfp4+sr/fp32@8", "split:fp8b128+rtn/fp32@5",
                             "split:fp16+sr/fp32@16"}) {
      CAPTURE(static_cast<int>(kind));
      const std::string policy_text(text);
    CAPTURE(policy_text);
      const ssm::PrecisionPolicy p = ssm::PrecisionPolicy::parse(text);
      const int dk = p.read.format == formats::StorageFormat::fp8b128 ? 128 : 32;
      const test::GroupData d = test::make_group_data({kind, dk, 12, 3}, 203, 0.9f, 0.999f, ++seed);
      const auto heads = ssm::measure_state_error(d.sequence(), p, ssm::HeadGroupId{2, 1});
      REQUIRE(heads.size() == 3);
      for (const auto& h : heads) {
        CAPTURE(h.value_head);
        CHECK(h.value_head >= 3);
        CHECK(h.events == 203 / p.window);
        CHECK(h.measured_ms > 0);
        CHECK(h.recur_measured_ms == 0.0);  // the HP copy is the exact state
        CHECK(h.measured_ms == doctest::Approx(h.predicted_ms).epsilon(1e-9));
        CHECK(h.coherent_ms == doctest::Approx(h.predicted_ms).epsilon(1e-9));
        CHECK(h.mean_gamma > 0);
        CHECK(h.mean_gamma2 <= h.mean_gamma);
        if (kind == ssm::Recurrence::mamba2) {  // the FP32 recur copy receives no rounding error at all
          CHECK(h.realized_var == 0.0);
          CHECK(h.realized_predicted_ms == doctest::Approx(h.predicted_ms).epsilon(1e-9));
        } else {
          CHECK(std::isnan(h.realized_predicted_ms));  // the delta rule does not carry D by gamma alone
        }
      }
    }
  }
}

TEST_CASE("state error: shared SR on Mamba-2 accumulates as sigma^2 / (1 - E[gamma^2]); RTN between the models") {
  const int L = 16;
  // Slow decays, so that the accumulation is large against one rounding.
  const test::GroupData d =
      test::make_group_data({ssm::Recurrence::mamba2, 16, 8, 2}, 300 * L + 7, 0.985f, 0.995f, test::kBaseSeed + 1102);
  for (const char* text : {"shared:fp16+sr@16", "shared:nvfp4+sr@16"}) {
    const std::string policy_text(text);
    CAPTURE(policy_text);
    for (const auto& h : ssm::measure_state_error(d.sequence(), ssm::PrecisionPolicy::parse(text), {})) {
      const double one = h.rounding_var + h.rounding_bias * h.rounding_bias;
      MESSAGE(std::string(text) << " head " << h.value_head << ": measured " << h.measured_ms << ", predicted " << h.predicted_ms
                   << ", one rounding " << one << ", E[gamma^2] " << h.mean_gamma2);
      // 150 steady-state flushes x 128 elements, correlated over ~1/(1 - E[gamma^2]) flushes: a few
      // percent of sampling error; the accumulation factor is > 3, so one rounding is excluded.
      CHECK(h.measured_ms == doctest::Approx(h.predicted_ms).epsilon(0.2));
      CHECK(h.predicted_ms > 3 * one);
      CHECK(std::abs(h.measured_bias) < 0.2 * std::sqrt(h.measured_ms));  // SR: unbiased
      // The errors the checkpoint actually received: SR is unbiased given its input, so they do not
      // correlate with the carried error, and with their own variance the model predicts as well.
      CHECK(std::abs(h.realized_cross) < 0.1 * std::sqrt(h.realized_var * h.measured_ms));
      CHECK(h.measured_ms == doctest::Approx(h.realized_predicted_ms).epsilon(0.2));
      CHECK(h.realized_var == doctest::Approx(h.rounding_var).epsilon(0.3));  // updates move the state by > 1 step
    }
  }
  for (const auto& h : ssm::measure_state_error(d.sequence(), ssm::PrecisionPolicy::parse("shared:nvfp4+rtn@16"), {})) {
    MESSAGE("shared:nvfp4+rtn@16 head " << h.value_head << ": measured " << h.measured_ms << ", independent "
                                        << h.predicted_ms << ", coherent " << h.coherent_ms);
    CHECK(h.measured_ms <= h.coherent_ms * 1.2);
  }
}

TEST_CASE("state error: KDA's error accumulates per key channel; gamma averaged over the channels under-predicts") {
  // A quarter of the channels slow (alpha 0.998), the rest fast (0.5), and beta tiny so that the
  // delta rule's contraction is negligible and D is carried by Diag(gamma) column by column. Each
  // column then accumulates sigma_c^2 / (1 - E[gamma_c^2]): the mean over the columns is the model;
  // averaging gamma over the channels first gives 1 / (1 - mean gamma^2), far too little.
  const int L = 16, dk = 16, n = 300 * L + 5;
  test::GroupData d = test::make_group_data({ssm::Recurrence::kda, dk, 8, 2}, n, 0.9f, 0.95f, test::kBaseSeed + 1105);
  for (auto& a : d.alpha)
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = (i % dk) < dk / 4 ? 0.998f : 0.5f;
  for (auto& b : d.beta) std::fill(b.begin(), b.end(), 1e-4f);
  for (const char* text : {"shared:fp16+sr@16", "shared:nvfp4+sr@16"}) {
    const std::string policy_text(text);
    CAPTURE(policy_text);
    for (const auto& h : ssm::measure_state_error(d.sequence(), ssm::PrecisionPolicy::parse(text), {})) {
      MESSAGE(text << " head " << h.value_head << ": measured " << h.measured_ms << ", per-channel model " << h.predicted_ms
                   << ", channel-mean model " << h.channel_mean_predicted_ms);
      // NVFP4+SR measures ~0.75 of the model: on the slow channels the value rounded lies near the
      // carried grid point, where SR's variance is below one rounding's (as on Mamba-2's slow heads).
      CHECK(h.measured_ms == doctest::Approx(h.predicted_ms).epsilon(0.35));
      CHECK(h.channel_mean_predicted_ms < 0.5 * h.measured_ms);
      CHECK(std::isnan(h.realized_predicted_ms));
    }
  }
  // Mamba-2 (one decay per head): the two forms are the same number.
  const test::GroupData m = test::make_group_data({ssm::Recurrence::mamba2, 16, 8, 2}, 40 * L, 0.9f, 0.99f, test::kBaseSeed + 1106);
  for (const auto& h : ssm::measure_state_error(m.sequence(), ssm::PrecisionPolicy::parse("shared:nvfp4+rtn@16"), {}))
    CHECK(h.channel_mean_predicted_ms == doctest::Approx(h.predicted_ms).epsilon(1e-12));
}

TEST_CASE("state error: SR of a checkpoint that a window hardly moves has less variance than one rounding") {
  // alpha = 1 and inputs of 1e-5 of the state's size: the value rounded at a flush is the carried
  // checkpoint (a grid point) plus a small update, where SR's variance (x - lo)(hi - x) is small; one
  // rounding of the exact state, which lies anywhere between grid points, is the wrong sigma^2.
  test::GroupData d =
      test::make_group_data({ssm::Recurrence::mamba2, 16, 8, 2}, 200 * 16, 0.9f, 0.95f, test::kBaseSeed + 1104);
  for (auto& a : d.alpha) std::fill(a.begin(), a.end(), 1.0f);
  for (auto& v : d.v)  // the state is made by the first window; later inputs are 1e-5 of it
    for (std::size_t i = v.size() / 200; i < v.size(); ++i) v[i] *= 1e-5f;
  for (const char* text : {"shared:fp16+sr@16", "shared:nvfp4+sr@16"}) {
    const std::string policy_text(text);
    CAPTURE(policy_text);
    for (const auto& h : ssm::measure_state_error(d.sequence(), ssm::PrecisionPolicy::parse(text), {})) {
      MESSAGE(text << " head " << h.value_head << ": one rounding of S " << h.rounding_var << ", realized "
                   << h.realized_var << ", measured " << h.measured_ms);
      CHECK(h.mean_gamma2 == 1.0);
      CHECK(h.realized_var < 0.1 * h.rounding_var);
      CHECK(h.realized_var > 0.0);
    }
  }
}

TEST_CASE("state error: refusals") {
  const test::GroupData d = test::make_group_data({ssm::Recurrence::mamba2, 16, 4, 1}, 40, 0.9f, 0.99f, test::kBaseSeed + 1103);
  const auto run = [&](const char* p) {
    return test::error_of<std::invalid_argument>(
        [&] { ssm::measure_state_error(d.sequence(), ssm::PrecisionPolicy::parse(p), {}); });
  };
  CHECK(test::contains(run("conv:nvfp4+rtn"), "conventional"));
  CHECK(test::contains(run("shared:fp32@8"), "FP32"));
  CHECK(test::contains(run("shared:nvfp4+rtn@32"), "at least 2"));
}
