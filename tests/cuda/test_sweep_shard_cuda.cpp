// The CUDA engine's part in a multi-process sweep (docs/MPI_SWEEP.md): a reference exported by one
// engine (reference_hidden) and imported by another (set_reference_hidden) must be the same bits,
// and the importing engine must compare every configuration exactly as the one that computed the
// reference (every field of every PositionResult equal); sizes are checked; and
// bind_device_for_local_rank picks GPU local_rank % device_count. On the bundled Mamba-2 goldens,
// N = 300 positions in chunks of 128 (a short last chunk). Skips (77) without a GPU.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cuda_check.h"
#include "eval/cuda_sweep_engine.h"
#include "model/teacher_forced_model.h"
#include "../model/test_model_util.h"
#include "gpu_test_util.h"

using namespace replayssm;

namespace {

const test::GpuGuard gpu_guard("GPU sweep-shard tests");

constexpr int64_t kN = 300;
constexpr int kChunk = 128;

std::vector<int32_t> tokens(int vocab, uint64_t seed) {
  boost::random::mt19937_64 rng(seed);
  boost::random::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::vector<int32_t> t(static_cast<std::size_t>(kN + 1));
  for (auto& x : t) x = tok(rng);
  return t;
}

std::vector<eval::PositionResult> compare_all(eval::SweepEngine& e, const ssm::PrecisionPolicy& p,
                                              std::span<const int32_t> targets) {
  std::vector<eval::PositionResult> out(targets.size());
  eval::CompareCallbacks cb;
  cb.on_results = [&](int64_t first, std::span<const eval::PositionResult> r) {
    for (std::size_t i = 0; i < r.size(); ++i) out[static_cast<std::size_t>(first) + i] = r[i];
  };
  e.compare(p, targets, kChunk, cb);
  return out;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Every field equal (KL and delta_p bit for bit); on failure the first differing position.
void check_same_results(const std::vector<eval::PositionResult>& a, const std::vector<eval::PositionResult>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const bool same = same_bits(a[i].kl, b[i].kl) && same_bits(a[i].delta_p, b[i].delta_p) &&
                      a[i].has_target == b[i].has_target && a[i].top1_agree == b[i].top1_agree &&
                      a[i].finite == b[i].finite && a[i].ref_finite == b[i].ref_finite &&
                      a[i].nonfinite_values == b[i].nonfinite_values;
    if (!same) {
      FAIL(fmt::format("position {}: kl {:.17g} vs {:.17g}, delta_p {:.17g} vs {:.17g}, top1 {} vs {}, finite {} vs "
                       "{}, nonfinite_values {} vs {}",
                       i, a[i].kl, b[i].kl, a[i].delta_p, b[i].delta_p, a[i].top1_agree, b[i].top1_agree,
                       a[i].finite, b[i].finite, a[i].nonfinite_values, b[i].nonfinite_values));
    }
  }
}

}  // namespace

TEST_CASE("a reference handed from one CUDA engine to another is the same bits and compares the same") {
  for (const char* name : {"mamba2_tiny", "tiny_mamba2"}) {
    CAPTURE(name);
    const std::unique_ptr<model::TeacherForcedModel> lm = model::load_teacher_forced_model(test::golden_dir(name));
    std::ostream quiet(nullptr);
    const auto a = cuda::make_cuda_engine(*lm, cuda::GemmPrecision::fp32, kChunk, quiet);
    const auto b = cuda::make_cuda_engine(*lm, cuda::GemmPrecision::fp32, kChunk, quiet);
    const std::vector<int32_t> t = tokens(lm->vocab_size(), 15);
    const std::span<const int32_t> input(t.data(), kN), targets(t.data() + 1, kN);
    const auto ref = ssm::PrecisionPolicy::parse("conv:fp32");
    a->set_reference(input, ref);
    const std::vector<float> hidden = a->reference_hidden();
    REQUIRE(hidden.size() == static_cast<std::size_t>(kN * lm->hidden_size()));
    std::size_t nonzero = 0;
    for (float x : hidden) nonzero += x != 0.0f && std::isfinite(x);
    CHECK(nonzero > hidden.size() / 2);  // real hidden states, not an empty buffer

    b->set_reference_hidden(input, ref, hidden);
    const std::vector<float> back = b->reference_hidden();
    REQUIRE(back.size() == hidden.size());
    const int diff = std::memcmp(back.data(), hidden.data(), hidden.size() * sizeof(float));
    if (diff != 0)
      for (std::size_t i = 0; i < hidden.size(); ++i)
        if (std::memcmp(&back[i], &hidden[i], sizeof(float)) != 0) {
          FAIL(fmt::format("reference_hidden after set_reference_hidden: first difference at {} (row {}, col {}): "
                           "{:.9g} vs {:.9g}",
                           i, i / static_cast<std::size_t>(lm->hidden_size()),
                           i % static_cast<std::size_t>(lm->hidden_size()), back[i], hidden[i]));
          break;
        }

    for (const char* p : {"shared:nvfp4+sr@16", "split:nvfp4+rtn/fp16+sr@16", "conv:fp32"}) {
      CAPTURE(p);
      const auto policy = ssm::PrecisionPolicy::parse(p);
      const auto ra = compare_all(*a, policy, targets), rb = compare_all(*b, policy, targets);
      check_same_results(ra, rb);
      if (std::string(p) == "conv:fp32")
        for (const auto& r : ra) CHECK(r.kl == 0.0);  // the reference against itself
    }
    // A reference of the wrong size is refused, naming the sizes.
    CHECK_THROWS_WITH_AS(b->set_reference_hidden(input, ref, std::span<const float>(hidden.data(), 7)),
                         doctest::Contains("7 floats for 300 positions"), std::invalid_argument);
  }
}

TEST_CASE("bind_device_for_local_rank picks GPU local_rank % device_count") {
  int count = 0;
  REPLAYSSM_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int local_rank : {0, 1, count, count + 1, 3 * count - 1}) {
    CAPTURE(local_rank);
    const std::string said = cuda::bind_device_for_local_rank(local_rank);
    int current = -1;
    REPLAYSSM_CUDA_CHECK(cudaGetDevice(&current));
    CHECK(current == local_rank % count);
    CHECK(said == fmt::format("GPU {} of {} (local rank {} % {})", local_rank % count, count, local_rank, count));
  }
  CHECK_THROWS_AS(cuda::bind_device_for_local_rank(-1), std::invalid_argument);
  REPLAYSSM_CUDA_CHECK(cudaSetDevice(0));
}
