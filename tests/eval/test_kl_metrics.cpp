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
    boost::random::uniform_int_distribution<int> tok(0, vocab - 1);
    for (int r = 0; r < ref.rows(); ++r) {
      const int32_t target = tok(rng);
      const PositionResult p = compare_position(ref.row(r).data(), cfg.row(r).data(), vocab, target);
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
  for (int r = 0; r < 5; ++r) {
    const PositionResult p = compare_position(ref.row(r).data(), ref.row(r).data(), 300, 3);
    CHECK(p.kl == 0.0);
    CHECK(p.delta_p == 0.0);
    CHECK(p.top1_agree);
  }
  // p_ref = 0 where log p_cfg = -inf: finite (the entry is still counted as a non-finite value).
  const float inf = std::numeric_limits<float>::infinity();
  const float a[3] = {std::log(0.5f), std::log(0.5f), -inf};
  const float b[3] = {std::log(0.25f), std::log(0.75f), -inf};
  const PositionResult p = compare_position(a, b, 3, 0);
  CHECK(p.finite);
  CHECK(p.nonfinite_values == 1);
  CHECK(p.kl == doctest::Approx(0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75)));
  // log p_cfg = -inf where p_ref > 0: KL = +inf, a non-finite position.
  const float c[3] = {0.0f, -inf, -inf};
  const PositionResult q = compare_position(b, c, 3, 0);
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
  CHECK(std::isfinite(s.pct.value[4]));

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
  // np.percentile([1, 2, 3, 4, 5], [50, 90, 99, 99.9, 100]) = [3, 4.6, 4.96, 4.996, 5]
  CHECK(p.value[0] == 3.0);
  CHECK(p.value[1] == doctest::Approx(4.6).epsilon(1e-15));
  CHECK(p.value[2] == doctest::Approx(4.96).epsilon(1e-15));
  CHECK(p.value[3] == doctest::Approx(4.996).epsilon(1e-15));
  CHECK(p.value[4] == 5.0);
  const std::vector<float> one = {2.5f};
  CHECK(percentiles(one).value == std::array<double, 5>{2.5, 2.5, 2.5, 2.5, 2.5});
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

namespace {

// Bitwise equality of two results (NaN equal to NaN of any payload: the class is what is stored).
bool same_result(const PositionResult& a, const PositionResult& b) {
  const auto same = [](double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; };
  return same(a.kl, b.kl) && same(a.delta_p, b.delta_p) && a.has_target == b.has_target &&
         a.top1_agree == b.top1_agree && a.finite == b.finite && a.ref_finite == b.ref_finite &&
         a.nonfinite_values == b.nonfinite_values;
}

// The KL centred on the exact mean in long double, an arrangement independent of kl_terms.h:
// with e = d - E_p[d] (d = log-ratio of the rows), KL = E_p[e] + log1p(E_p[expm1(-e)]), where the
// first term absorbs the rounding of the mean. Accurate to ~1e-14 relative at KL ~ 1e-10.
long double centred_kl(const float* a, const float* b, int vocab) {
  long double ma = -INFINITY;
  for (int i = 0; i < vocab; ++i) ma = std::max(ma, static_cast<long double>(a[i]));
  long double w_sum = 0, wd = 0;
  for (int i = 0; i < vocab; ++i) {
    const long double w = std::exp(static_cast<long double>(a[i]) - ma);
    w_sum += w;
    wd += w * (static_cast<long double>(a[i]) - b[i]);
  }
  const long double mean = wd / w_sum;
  long double t = 0, s = 0;
  for (int i = 0; i < vocab; ++i) {
    const long double w = std::exp(static_cast<long double>(a[i]) - ma);
    const long double e = (static_cast<long double>(a[i]) - b[i]) - mean;
    t += w * e;
    s += w * std::expm1(-e);
  }
  return t / w_sum + std::log1p(s / w_sum);
}

}  // namespace

TEST_CASE("compare_positions over strided rows equals compare_position row by row; add_results equals add_chunk") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 5);
  const int n = 37, V = 61, ld = V + 5;
  const LogProbRows ref = random_log_probs(n, V, 2.5, rng);
  LogProbRows cfg = ref;
  boost::random::normal_distribution<double> noise(0.0, 1.0);
  for (int r = 0; r < n; ++r)
    for (int v = 0; v < V; ++v) cfg(r, v) += static_cast<float>(noise(rng) * (r % 3 == 0 ? 1e-4 : 0.5));
  cfg(4, 7) = -INFINITY;                                    // KL = +Inf
  cfg(9, 60) = std::numeric_limits<float>::quiet_NaN();    // non-finite configuration row
  cfg(11, 3) = cfg(11, 40) = cfg.row(11).maxCoeff() + 1.0f;  // a tie for the argmax
  // Padded copies: the 5 floats after each row are NaN, so reading past the vocabulary shows.
  std::vector<float> ref_pad(static_cast<std::size_t>(n) * ld, NAN), cfg_pad(ref_pad);
  for (int r = 0; r < n; ++r)
    for (int v = 0; v < V; ++v) {
      ref_pad[static_cast<std::size_t>(r) * ld + v] = ref(r, v);
      cfg_pad[static_cast<std::size_t>(r) * ld + v] = cfg(r, v);
    }
  std::vector<int32_t> targets(n);
  for (int i = 0; i < n; ++i) targets[static_cast<std::size_t>(i)] = i % 5 == 0 ? -1 : (11 * i) % V;

  for (int threads : {1, 3}) {
    std::vector<PositionResult> out(n);
    compare_positions(ref_pad.data(), cfg_pad.data(), n, V, ld, targets.data(), out.data(), threads);
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      CHECK(same_result(out[static_cast<std::size_t>(i)],
                        compare_position(ref.row(i).data(), cfg.row(i).data(), V, targets[static_cast<std::size_t>(i)])));
    }
    CHECK(std::isinf(out[4].kl));
    CHECK_FALSE(out[4].finite);
    CHECK(std::isnan(out[9].kl));
    CHECK_FALSE(out[5].has_target);
  }

  // add_results of compare_positions' output accumulates exactly as add_chunk (same order of
  // positions, other chunk sizes); the Eigen path reads the padded rows through their outer stride.
  using Strided = Eigen::Map<const LogProbRows, 0, Eigen::OuterStride<>>;
  const Strided ref_view(ref_pad.data(), n, V, Eigen::OuterStride<>(ld));
  const Strided cfg_view(cfg_pad.data(), n, V, Eigen::OuterStride<>(ld));
  const auto edges = length_bucket_edges(n);
  CellAccumulator by_chunk(n, edges, 2), by_results(n, edges, 1);
  by_chunk.add_chunk(0, ref_view.topRows(20), cfg_view.topRows(20), std::span<const int32_t>(targets).first(20));
  by_chunk.add_chunk(20, ref.bottomRows(n - 20), cfg.bottomRows(n - 20), std::span<const int32_t>(targets).last(n - 20));
  std::vector<PositionResult> all(n);
  compare_positions(ref.data(), cfg.data(), n, V, V, targets.data(), all.data(), 1);
  by_results.add_results(0, std::span<const PositionResult>(all).first(30));
  by_results.add_results(30, std::span<const PositionResult>(all).last(n - 30));
  const KlStats a = by_chunk.finish(), b = by_results.finish();
  for (int i = 0; i < n; ++i) {
    const float x = by_chunk.kl()[static_cast<std::size_t>(i)], y = by_results.kl()[static_cast<std::size_t>(i)];
    CHECK(((std::isnan(x) && std::isnan(y)) || x == y));
  }
  CHECK(a.bucket_sum == b.bucket_sum);
  CHECK(a.bucket_count == b.bucket_count);
  CHECK(a.kl_sum == b.kl_sum);
  CHECK(a.delta_p_sum == b.delta_p_sum);
  CHECK(a.top1_agree == b.top1_agree);
  CHECK(a.nonfinite_positions == b.nonfinite_positions);
  CHECK(a.nonfinite_values == b.nonfinite_values);
  CHECK(a.pct.value == b.pct.value);
  // add_results refuses what add_chunk refuses, and adds nothing then.
  CellAccumulator c(n, edges, 1);
  c.add_results(0, std::span<const PositionResult>(all).first(10));
  CHECK_THROWS_AS(c.add_results(5, std::span<const PositionResult>(all).first(10)), std::invalid_argument);
  CHECK_THROWS_AS(c.add_results(n - 5, std::span<const PositionResult>(all).first(10)), std::invalid_argument);
  CHECK(c.positions_added() == 10);
}

TEST_CASE("compare_positions refuses bad shapes and targets, naming the row") {
  const float row[4] = {0.0f, -1.0f, -2.0f, -3.0f};
  PositionResult out[2];
  const int32_t ok[2] = {0, -1}, bad[2] = {1, 4};
  CHECK_THROWS_AS(compare_positions(row, row, 1, 0, 4, ok, out), std::invalid_argument);
  CHECK_THROWS_AS(compare_positions(row, row, 1, 4, 3, ok, out), std::invalid_argument);
  const std::string msg = replayssm::test::error_of<std::invalid_argument>(
      [&] { compare_positions(row, row, 2, 2, 2, bad, out); });
  CHECK(replayssm::test::contains(msg, "target token 4 of row 1"));
  CHECK_THROWS_AS(compare_position(row, row, 4, 4), std::invalid_argument);
}

TEST_CASE("a KL of 1e-10 is resolved to 1e-12 relative, from log-probs and from raw logits") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 6);
  for (int vocab : {1000, 50257}) {
    const LogProbRows ref = random_log_probs(4, vocab, 3.0, rng);
    boost::random::normal_distribution<double> noise(0.0, 1.0);
    for (int r = 0; r < 4; ++r) {
      const double sigma = r < 2 ? 1.4e-5 : 1e-3, offset = r % 2 ? 7.25 : 0.0;  // KL ~ sigma^2 / 2
      std::vector<float> cfg(static_cast<std::size_t>(vocab));
      for (int v = 0; v < vocab; ++v) cfg[static_cast<std::size_t>(v)] = static_cast<float>(ref(r, v) + offset + sigma * noise(rng));
      const PositionResult p = compare_position(ref.row(r).data(), cfg.data(), vocab, 1);
      const auto oracle = static_cast<double>(centred_kl(ref.row(r).data(), cfg.data(), vocab));
      CAPTURE(vocab);
      CAPTURE(r);
      CAPTURE(oracle);
      CAPTURE(p.kl);
      CHECK(oracle > 0.1 * sigma * sigma);
      CHECK(std::abs(p.kl - oracle) <= 1e-12 * oracle);
    }
  }
}

TEST_CASE("edge rows: first-index ties, cfg far below at the reference's top token, -inf at the top token") {
  // Ties: the first index wins in both rows.
  const float a[5] = {0.0f, 1.0f, -1.0f, 1.0f, 0.5f}, b[5] = {2.0f, 0.0f, 2.0f, 2.0f, 0.0f}, c[5] = {0.0f, 1.0f, 1.0f, -1.0f, 0.0f};
  CHECK_FALSE(compare_position(a, b, 5, 0).top1_agree);  // argmax 1 vs 0
  CHECK(compare_position(a, c, 5, 0).top1_agree);        // argmax 1 vs 1
  // cfg 800 below its max at the reference's argmax (the anchor moves to cfg's max): finite KL.
  const float r2[2] = {0.0f, -1.0f}, c2[2] = {-800.0f, 0.0f};
  const double p0 = 1.0 / (1.0 + std::exp(-1.0)), p1 = 1.0 - p0, lq0 = -800.0 - std::log1p(std::exp(-800.0));
  const PositionResult x = compare_position(r2, c2, 2, 0);
  CHECK(x.finite);
  CHECK(x.kl == doctest::Approx(p0 * (std::log(p0) - lq0) + p1 * std::log(p1)).epsilon(1e-14));
  CHECK(x.delta_p == doctest::Approx(std::exp(lq0) - p0).epsilon(1e-14));
  // cfg = -inf at the reference's argmax: KL = +inf, delta-p still defined.
  const float c3[2] = {-INFINITY, 0.0f};
  const PositionResult y = compare_position(r2, c3, 2, 1);
  CHECK(y.kl == std::numeric_limits<double>::infinity());
  CHECK_FALSE(y.finite);
  CHECK(y.nonfinite_values == 1);
  CHECK(y.delta_p == doctest::Approx(1.0 - p1).epsilon(1e-14));
  // A reference row of -inf only has no distribution; a configuration row of -inf only neither.
  const float ninf[2] = {-INFINITY, -INFINITY};
  CHECK_FALSE(compare_position(ninf, r2, 2, 0).ref_finite);
  const PositionResult z = compare_position(r2, ninf, 2, 0);
  CHECK(z.ref_finite);
  CHECK_FALSE(z.finite);
  CHECK(std::isnan(z.kl));
  CHECK(z.nonfinite_values == 2);
}
