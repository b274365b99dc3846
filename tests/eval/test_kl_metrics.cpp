#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "eval/kl_oracle.h"
#include "eval/kl_metrics.h"
#include "test_util.h"

using namespace replayssm::eval;

namespace {

// float32 log-softmax rows of random logits (like a model's output).
LogProbRows random_log_probs(int rows, int vocab, double scale, boost::random::mt19937_64& rng) {
  boost::random::normal_distribution<double> normal(0.0, scale);
  LogProbRows lp(rows, vocab);
  for (int r = 0; r < rows; ++r) {
    std::vector<double> z(static_cast<std::size_t>(vocab));
    double m = -INFINITY;
    for (auto& x : z) m = std::max(m, x = normal(rng));
    double s = 0;
    for (double x : z) s += std::exp(x - m);
    for (int v = 0; v < vocab; ++v) lp(r, v) = static_cast<float>(z[static_cast<std::size_t>(v)] - m - std::log(s));
  }
  return lp;
}

using replayssm::test::direct_kl;

}  // namespace

TEST_CASE("length buckets are a function of N: 1K, 2K, ... for long runs, finer for short ones") {
  CHECK(length_bucket_edges(131072) ==
        std::vector<int64_t>{0, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072});
  CHECK(length_bucket_edges(100000) == std::vector<int64_t>{0, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 100000});
  CHECK(length_bucket_edges(4096) == std::vector<int64_t>{0, 64, 128, 256, 512, 1024, 2048, 4096});
  CHECK(length_bucket_edges(300) == std::vector<int64_t>{0, 16, 32, 64, 128, 256, 300});
  CHECK(length_bucket_edges(16) == std::vector<int64_t>{0, 16});
  CHECK(length_bucket_edges(5) == std::vector<int64_t>{0, 5});
  CHECK(length_bucket_edges(0) == std::vector<int64_t>{0});
  const auto e = length_bucket_edges(131072);
  CHECK(bucket_of(e, 1) == 0);
  CHECK(bucket_of(e, 1024) == 0);
  CHECK(bucket_of(e, 1025) == 1);
  CHECK(bucket_of(e, 131072) == 7);
  CHECK_THROWS(bucket_of(e, 0));
  CHECK_THROWS(bucket_of(e, 131073));
}

TEST_CASE("KL, top-1 and delta-p agree with a direct float64 computation on random distributions") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 1);
  for (int vocab : {2, 7, 64, 1000}) {
    const LogProbRows ref = random_log_probs(20, vocab, 3.0, rng);
    LogProbRows cfg = ref;
    boost::random::normal_distribution<double> noise(0.0, 0.3);
    for (int r = 0; r < cfg.rows(); ++r)
      for (int v = 0; v < vocab; ++v) cfg(r, v) += static_cast<float>(noise(rng));  // unnormalised on purpose
    std::vector<double> scratch(static_cast<std::size_t>(vocab));
    boost::random::uniform_int_distribution<int> tok(0, vocab - 1);
    for (int r = 0; r < ref.rows(); ++r) {
      const int32_t target = tok(rng);
      const PositionResult p = compare_position(ref.row(r).data(), cfg.row(r).data(), vocab, target, scratch.data());
      const double d = direct_kl(ref.row(r).data(), cfg.row(r).data(), vocab);
      CAPTURE(vocab);
      CAPTURE(r);
      CHECK(p.finite);
      CHECK(p.nonfinite_values == 0);
      CHECK(p.kl == doctest::Approx(d).epsilon(1e-12));
      CHECK(p.kl >= -1e-15);
      int ar = 0, ac = 0;
      for (int v = 1; v < vocab; ++v) {
        if (ref(r, v) > ref(r, ar)) ar = v;
        if (cfg(r, v) > cfg(r, ac)) ac = v;
      }
      CHECK(p.top1_agree == (ar == ac));
      double zr = 0, zc = 0;
      for (int v = 0; v < vocab; ++v) {
        zr += std::exp(double(ref(r, v)));
        zc += std::exp(double(cfg(r, v)));
      }
      const double dp = std::exp(double(cfg(r, target))) / zc - std::exp(double(ref(r, target))) / zr;
      CHECK(p.delta_p == doctest::Approx(dp).epsilon(1e-12));
    }
  }
}

TEST_CASE("identical distributions give KL exactly 0; zero-probability entries contribute nothing") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 2);
  const LogProbRows ref = random_log_probs(5, 300, 4.0, rng);
  std::vector<double> scratch(300);
  for (int r = 0; r < 5; ++r) {
    const PositionResult p = compare_position(ref.row(r).data(), ref.row(r).data(), 300, 3, scratch.data());
    CHECK(p.kl == 0.0);
    CHECK(p.delta_p == 0.0);
    CHECK(p.top1_agree);
  }
  // p_ref = 0 where log p_cfg = -inf: finite (the entry is still counted as a non-finite value).
  const float inf = std::numeric_limits<float>::infinity();
  const float a[3] = {std::log(0.5f), std::log(0.5f), -inf};
  const float b[3] = {std::log(0.25f), std::log(0.75f), -inf};
  const PositionResult p = compare_position(a, b, 3, 0, scratch.data());
  CHECK(p.finite);
  CHECK(p.nonfinite_values == 1);
  CHECK(p.kl == doctest::Approx(0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75)));
  // log p_cfg = -inf where p_ref > 0: KL = +inf, a non-finite position.
  const float c[3] = {0.0f, -inf, -inf};
  const PositionResult q = compare_position(b, c, 3, 0, scratch.data());
  CHECK_FALSE(q.finite);
  CHECK(q.kl == std::numeric_limits<double>::infinity());
}

TEST_CASE("non-finite rows are counted, stored and left out of every statistic; never a crash") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 3);
  const int n = 40, V = 16;
  const LogProbRows ref = random_log_probs(n, V, 2.0, rng);
  LogProbRows cfg = random_log_probs(n, V, 2.0, rng);
  cfg(5, 3) = std::numeric_limits<float>::quiet_NaN();          // one NaN value
  for (int v = 0; v < V; ++v) cfg(17, v) = std::numeric_limits<float>::quiet_NaN();  // a NaN row
  cfg(30, 0) = std::numeric_limits<float>::infinity();
  LogProbRows ref_bad = ref;
  ref_bad(33, 2) = std::numeric_limits<float>::quiet_NaN();     // a broken reference row
  std::vector<int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[static_cast<std::size_t>(i)] = i % V;

  CellAccumulator acc(n, length_bucket_edges(n), 2);
  acc.add_chunk(0, ref_bad.topRows(20), cfg.topRows(20), std::span<const int32_t>(targets).first(20));
  CHECK_FALSE(acc.complete());
  CHECK_THROWS_AS(acc.finish(), std::logic_error);
  acc.add_chunk(20, ref_bad.bottomRows(20), cfg.bottomRows(20), std::span<const int32_t>(targets).last(20));
  REQUIRE(acc.complete());
  const KlStats s = acc.finish();
  CHECK(s.positions == n);
  CHECK(s.nonfinite_positions == 4);
  CHECK(s.ref_nonfinite_positions == 1);
  CHECK(s.finite_positions == n - 4);
  CHECK(s.nonfinite_values == 1 + V + 1);
  CHECK(std::isnan(acc.kl()[5]));
  CHECK(std::isnan(acc.kl()[17]));
  CHECK(std::isnan(acc.kl()[30]));
  CHECK(std::isnan(acc.kl()[33]));
  // Means over the finite positions only, compared with the direct computation.
  double sum = 0;
  int count = 0, agree = 0;
  std::vector<double> vals;
  for (int i = 0; i < n; ++i) {
    if (i == 5 || i == 17 || i == 30 || i == 33) continue;
    const double d = direct_kl(ref.row(i).data(), cfg.row(i).data(), V);
    CHECK(acc.kl()[static_cast<std::size_t>(i)] == doctest::Approx(d).epsilon(1e-6));
    sum += d;
    ++count;
    int ar = 0, ac = 0;
    for (int v = 1; v < V; ++v) {
      if (ref(i, v) > ref(i, ar)) ar = v;
      if (cfg(i, v) > cfg(i, ac)) ac = v;
    }
    agree += ar == ac;
  }
  CHECK(s.mean_kl() == doctest::Approx(sum / count).epsilon(1e-12));
  CHECK(s.top1() == doctest::Approx(double(agree) / count));
  CHECK(std::isfinite(s.mean_delta_p()));
  int64_t total = 0;
  for (auto c : s.bucket_count) total += c;
  CHECK(total == n - 4);
  CHECK(std::isfinite(s.pct.value[3]));

  // Everything non-finite: statistics are NaN, counts are exact.
  LogProbRows nan_rows(3, V);
  nan_rows.setConstant(std::numeric_limits<float>::quiet_NaN());
  CellAccumulator all_bad(3, length_bucket_edges(3), 1);
  const int32_t t3[3] = {0, 1, 2};
  all_bad.add_chunk(0, ref.topRows(3), nan_rows, t3);
  const KlStats b = all_bad.finish();
  CHECK(b.nonfinite_positions == 3);
  CHECK(std::isnan(b.mean_kl()));
  CHECK(std::isnan(b.top1()));
  CHECK(std::isnan(b.pct.value[0]));
  CHECK(std::isnan(b.bucket_mean()[0]));
}

TEST_CASE("results do not depend on the chunking or the thread count") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 4);
  const int n = 333, V = 50;
  const LogProbRows ref = random_log_probs(n, V, 2.0, rng);
  const LogProbRows cfg = random_log_probs(n, V, 2.0, rng);
  std::vector<int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[static_cast<std::size_t>(i)] = (7 * i) % V;
  const auto edges = length_bucket_edges(n);
  CellAccumulator one(n, edges, 1);
  one.add_chunk(0, ref, cfg, targets);
  const KlStats a = one.finish();
  CellAccumulator many(n, edges, 3);
  for (int p0 = 0; p0 < n; p0 += 64) {
    const int rows = std::min(64, n - p0);
    many.add_chunk(p0, ref.middleRows(p0, rows), cfg.middleRows(p0, rows),
                   std::span<const int32_t>(targets).subspan(static_cast<std::size_t>(p0), static_cast<std::size_t>(rows)));
  }
  const KlStats b = many.finish();
  CHECK(one.kl() == many.kl());
  CHECK(a.bucket_sum == b.bucket_sum);
  CHECK(a.bucket_count == b.bucket_count);
  CHECK(a.kl_sum == b.kl_sum);
  CHECK(a.top1_agree == b.top1_agree);
  CHECK(a.pct.value == b.pct.value);

  // Overlapping or out-of-range chunks and bad targets are programming errors.
  CellAccumulator c(n, edges, 1);
  c.add_chunk(0, ref.topRows(10), cfg.topRows(10), std::span<const int32_t>(targets).first(10));
  CHECK_THROWS_AS(c.add_chunk(5, ref.topRows(10), cfg.topRows(10), std::span<const int32_t>(targets).first(10)),
                  std::invalid_argument);
  CHECK_THROWS_AS(c.add_chunk(n - 5, ref.topRows(10), cfg.topRows(10), std::span<const int32_t>(targets).first(10)),
                  std::invalid_argument);
  const int32_t bad[1] = {V};
  CHECK_THROWS_AS(c.add_chunk(20, ref.topRows(1), cfg.topRows(1), bad), std::invalid_argument);
  CHECK_THROWS_AS(c.add_chunk(20, ref.topRows(2), cfg.topRows(1), std::span<const int32_t>(targets).first(2)),
                  std::invalid_argument);
}

TEST_CASE("percentiles follow numpy's linear interpolation and skip non-finite values") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v = {5, 1, nan, 4, 2, inf, 3};
  const Percentiles p = percentiles(v);
  // np.percentile([1, 2, 3, 4, 5], [50, 90, 99, 100]) = [3, 4.6, 4.96, 5]
  CHECK(p.value[0] == 3.0);
  CHECK(p.value[1] == doctest::Approx(4.6).epsilon(1e-15));
  CHECK(p.value[2] == doctest::Approx(4.96).epsilon(1e-15));
  CHECK(p.value[3] == 5.0);
  const std::vector<float> one = {2.5f};
  CHECK(percentiles(one).value == std::array<double, 4>{2.5, 2.5, 2.5, 2.5});
}

TEST_CASE("KlStats merge pools counts and sums") {
  const auto edges = length_bucket_edges(64);
  KlStats a(edges), b(edges);
  PositionResult r;
  r.kl = 0.5;
  r.top1_agree = true;
  r.has_target = true;
  r.delta_p = -0.1;
  a.add(0, r);
  r.kl = 1.5;
  r.top1_agree = false;
  b.add(40, r);
  PositionResult bad;
  bad.finite = false;
  bad.kl = NAN;
  bad.nonfinite_values = 3;
  b.add(41, bad);
  a.merge(b);
  CHECK(a.positions == 3);
  CHECK(a.finite_positions == 2);
  CHECK(a.nonfinite_values == 3);
  CHECK(a.mean_kl() == 1.0);
  CHECK(a.top1() == 0.5);
  CHECK(a.mean_delta_p() == doctest::Approx(-0.1));
  CHECK(a.bucket_count[0] == 1);
  CHECK(a.bucket_count[2] == 1);
  KlStats other(length_bucket_edges(65));
  CHECK_THROWS_AS(a.merge(other), std::invalid_argument);
}
