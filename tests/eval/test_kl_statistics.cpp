// The uncertainty and distribution statistics of the KL sweep (kl_metrics.h, issue 11): the
// target log-probabilities, RMS delta-p, top-1 and the perplexity ratio per bucket against a direct
// float64 computation on fresh random rows; the block bootstrap's standard error against what it
// must be (sigma / sqrt(n) for independent values, the long-run standard error for correlated
// ones, larger than the iid formula); determinism; stratified pooling over books; the spreads.
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "eval/kl_metrics.h"
#include "eval/statistics_table.h"
#include "test_util.h"

using namespace replayssm;
using namespace replayssm::eval;

namespace {

// float32 log-softmax rows of random logits.
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

// log-softmax of a float row in float64 (the oracle's renormalisation).
std::vector<double> log_softmax(const float* row, int vocab) {
  double m = -INFINITY;
  for (int v = 0; v < vocab; ++v) m = std::max(m, static_cast<double>(row[v]));
  double s = 0;
  for (int v = 0; v < vocab; ++v) s += std::exp(static_cast<double>(row[v]) - m);
  std::vector<double> out(static_cast<std::size_t>(vocab));
  for (int v = 0; v < vocab; ++v) out[static_cast<std::size_t>(v)] = static_cast<double>(row[v]) - m - std::log(s);
  return out;
}

int argmax(const float* row, int vocab) {
  int a = 0;
  for (int v = 1; v < vocab; ++v)
    if (row[v] > row[a]) a = v;
  return a;
}

// numpy's "linear" percentile of a sorted copy, written out independently.
double linear_percentile(std::vector<double> x, double q) {
  std::sort(x.begin(), x.end());
  const double h = q / 100.0 * static_cast<double>(x.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(h));
  const std::size_t hi = std::min(lo + 1, x.size() - 1);
  return x[lo] + (h - std::floor(h)) * (x[hi] - x[lo]);
}

// A cell of n positions whose KL values are given (finite, every position with a target).
KlStats stats_of(const std::vector<double>& kl) {
  const auto n = static_cast<int64_t>(kl.size());
  KlStats s(length_bucket_edges(n));
  for (int64_t t = 0; t < n; ++t) {
    PositionResult r;
    r.kl = kl[static_cast<std::size_t>(t)];
    r.has_target = true;
    r.top1_agree = true;
    s.add(t, r);
  }
  return s;
}

double bootstrap_mean_se(const KlStats& s, uint64_t seed = kBootstrapSeed) {
  const BlockSums* one = &s.blocks;
  return block_bootstrap(std::span<const BlockSums* const>(&one, 1), s.edges, kBootstrapResamples, seed).mean_kl;
}

}  // namespace

TEST_CASE("target log-probs, RMS delta-p, top-1 and the PPL ratio per bucket agree with float64 on random rows") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 101);
  const int n = 700, V = 97;
  const LogProbRows ref = random_log_probs(n, V, 2.5, rng);
  LogProbRows cfg = ref;
  boost::random::normal_distribution<double> noise(0.0, 0.4);
  for (int i = 0; i < n; ++i)
    for (int v = 0; v < V; ++v) cfg(i, v) += static_cast<float>(noise(rng));  // raw logits: renormalised
  boost::random::uniform_int_distribution<int> token(0, V - 1);
  std::vector<int32_t> targets(n);
  for (auto& t : targets) t = token(rng);
  targets[13] = -1;  // no next token known: out of delta-p and the perplexities, still in KL
  const auto edges = length_bucket_edges(n);
  CellAccumulator acc(n, edges, 2);
  acc.add_chunk(0, ref, cfg, targets);
  const KlStats s = acc.finish();

  const std::size_t K = edges.size() - 1;
  std::vector<double> sq(K, 0), lr(K, 0), kl_sum(K, 0);
  std::vector<int64_t> m(K, 0), agree(K, 0), count(K, 0);
  std::vector<std::vector<double>> kls(K);
  double sq_all = 0, lr_all = 0, ref_nll = 0;
  int64_t m_all = 0;
  std::vector<PositionResult> one(1);
  for (int i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(bucket_of(edges, i + 1));
    const std::vector<double> lp = log_softmax(ref.row(i).data(), V), lq = log_softmax(cfg.row(i).data(), V);
    double kl = 0;
    for (int v = 0; v < V; ++v) kl += std::exp(lp[static_cast<std::size_t>(v)]) * (lp[static_cast<std::size_t>(v)] - lq[static_cast<std::size_t>(v)]);
    kl_sum[k] += kl;
    kls[k].push_back(static_cast<float>(acc.kl()[static_cast<std::size_t>(i)]));
    ++count[k];
    agree[k] += argmax(ref.row(i).data(), V) == argmax(cfg.row(i).data(), V);
    const int32_t t = targets[static_cast<std::size_t>(i)];
    compare_positions(ref.row(i).data(), cfg.row(i).data(), 1, V, V, &t, one.data());
    if (t < 0) {
      CHECK_FALSE(one[0].has_target);
      continue;
    }
    const double lpt = lp[static_cast<std::size_t>(t)], lqt = lq[static_cast<std::size_t>(t)];
    CHECK(one[0].ref_logp_target == doctest::Approx(lpt).epsilon(1e-13));
    CHECK(one[0].cfg_logp_target == doctest::Approx(lqt).epsilon(1e-13));
    const double dp = std::exp(lqt) - std::exp(lpt);
    sq[k] += dp * dp, sq_all += dp * dp;
    lr[k] += lpt - lqt, lr_all += lpt - lqt;
    ref_nll -= lpt;
    ++m[k], ++m_all;
  }
  CHECK(s.delta_p_count == n - 1);
  CHECK(s.rms_delta_p() == doctest::Approx(std::sqrt(sq_all / double(m_all))).epsilon(1e-10));
  CHECK(s.ppl_ratio() == doctest::Approx(std::exp(lr_all / double(m_all))).epsilon(1e-12));
  CHECK(s.ref_ppl() == doctest::Approx(std::exp(ref_nll / double(m_all))).epsilon(1e-12));
  CHECK(s.ppl() == doctest::Approx(std::exp((ref_nll + lr_all) / double(m_all))).epsilon(1e-12));
  CHECK(s.ppl_ratio() > 1.0);  // the noisy configuration predicts the text worse, on average
  const auto top1 = s.bucket_top1(), rms = s.bucket_rms_delta_p(), ppl = s.bucket_ppl_ratio(), mean = s.bucket_mean();
  for (std::size_t k = 0; k < K; ++k) {
    CAPTURE(k);
    CHECK(s.bucket_target_count[k] == m[k]);
    CHECK(mean[k] == doctest::Approx(kl_sum[k] / double(count[k])).epsilon(1e-9));
    CHECK(top1[k] == doctest::Approx(double(agree[k]) / double(count[k])).epsilon(1e-15));
    CHECK(rms[k] == doctest::Approx(std::sqrt(sq[k] / double(m[k]))).epsilon(1e-10));
    CHECK(ppl[k] == doctest::Approx(std::exp(lr[k] / double(m[k]))).epsilon(1e-12));
    for (std::size_t q = 0; q < Percentiles::kLevels.size(); ++q)
      CHECK(s.bucket_pct[k].value[q] == doctest::Approx(linear_percentile(kls[k], Percentiles::kLevels[q])).epsilon(1e-14));
  }
  // The block sums add up to the totals, block by block over the positions they cover.
  const BlockSums& b = s.blocks;
  REQUIRE(b.block_length == bootstrap_block_length(edges));
  CHECK(b.size() == static_cast<std::size_t>((n + b.block_length - 1) / b.block_length));
  double kl_blocks = 0, lr_blocks = 0;
  int64_t c_blocks = 0, t_blocks = 0, a_blocks = 0;
  for (std::size_t j = 0; j < b.size(); ++j) {
    kl_blocks += b.kl_sum[j], lr_blocks += b.logratio_sum[j];
    c_blocks += b.count[j], t_blocks += b.target_count[j], a_blocks += b.top1_agree[j];
  }
  CHECK(kl_blocks == doctest::Approx(s.kl_sum).epsilon(1e-13));
  CHECK(lr_blocks == doctest::Approx(s.logratio_sum).epsilon(1e-10));
  CHECK(c_blocks == s.finite_positions);
  CHECK(t_blocks == s.delta_p_count);
  CHECK(a_blocks == s.top1_agree);
  // Every bucket edge but N is a block boundary (a block lies in one bucket).
  for (std::size_t k = 1; k + 1 < edges.size(); ++k) CHECK(edges[k] % b.block_length == 0);
  CHECK(std::isfinite(s.se.mean_kl));
  CHECK(std::isfinite(s.se.ppl_ratio));
  CHECK(std::isfinite(s.se.top1));
}

TEST_CASE("block bootstrap: sigma / sqrt(n) for independent values, the long-run SE for correlated ones") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 102);
  boost::random::normal_distribution<double> normal(0.0, 1.0);
  const int64_t n = 1 << 20;  // blocks of 128 to 1024 positions: 1,072 of them
  const double sigma = 0.25;
  std::vector<double> iid(static_cast<std::size_t>(n)), ar(static_cast<std::size_t>(n));
  const double rho = 0.9;
  double x = normal(rng) / std::sqrt(1 - rho * rho);
  for (std::size_t t = 0; t < iid.size(); ++t) {
    iid[t] = 1.0 + sigma * normal(rng);
    x = rho * x + normal(rng);                             // AR(1), stationary variance 1 / (1 - rho^2)
    ar[t] = 1.0 + sigma * std::sqrt(1 - rho * rho) * x;    // the same marginal sd sigma
  }
  const KlStats a = stats_of(iid), c = stats_of(ar);
  REQUIRE(a.blocks.block_length == 128);
  REQUIRE(bootstrap_block_lengths(a.edges).back() == 1024);
  const double iid_formula = sigma / std::sqrt(double(n));
  const double se_iid = bootstrap_mean_se(a), se_ar = bootstrap_mean_se(c);
  CAPTURE(se_iid);
  CAPTURE(se_ar);
  // The bootstrap's own spread: ~sqrt(1/(2 * 1072)) from the blocks, ~sqrt(1/(2 * 1000)) from the
  // resamples, ~3% together; 15% is 5 of them.
  CHECK(se_iid == doctest::Approx(iid_formula).epsilon(0.15));
  // AR(1): long-run SE = sigma sqrt((1 + rho) / (1 - rho)) / sqrt(n) = 4.36x the iid formula; blocks
  // of 1024 in the long buckets >> the correlation length ~10 capture it (bias ~2 rho / ((1 - rho^2)
  // 1024) < 1%).
  const double long_run = iid_formula * std::sqrt((1 + rho) / (1 - rho));
  CHECK(se_ar == doctest::Approx(long_run).epsilon(0.2));
  CHECK(se_ar > 3.0 * iid_formula);
  // Per bucket: the last bucket (512K positions, 512 blocks) of the iid data.
  const std::size_t last = a.edges.size() - 2;
  const BlockSums* one = &a.blocks;
  const StandardErrors e = block_bootstrap(std::span<const BlockSums* const>(&one, 1), a.edges);
  CHECK(e.bucket_mean[last] == doctest::Approx(sigma / std::sqrt(double(a.edges[last + 1] - a.edges[last]))).epsilon(0.2));
  CHECK(e.bucket_top1[last] == 0.0);  // every position agrees: no spread
  CHECK(e.bucket_ppl_ratio[last] == 0.0);  // logratio 0 everywhere: ratio exactly 1 in every replicate
  CHECK(e.mean_kl == se_iid);
  // Deterministic: the same blocks and seed give the same SE, bit for bit; another seed another
  // draw of about the same size.
  CHECK(bootstrap_mean_se(a) == se_iid);
  const double other = bootstrap_mean_se(a, kBootstrapSeed + 1);
  CHECK(other != se_iid);
  CHECK(other == doctest::Approx(se_iid).epsilon(0.15));
}

TEST_CASE("bootstrap blocks: 128 positions stored, each bucket resampled in >= 8 blocks of at most 1024") {
  const auto e128k = length_bucket_edges(131072);  // 0, 1K, 2K, ..., 64K, 128K
  CHECK(bootstrap_block_length(e128k) == 128);
  CHECK(bootstrap_block_lengths(e128k) == std::vector<int64_t>{128, 128, 256, 512, 1024, 1024, 1024, 1024});
  // N = 100000: the last bucket (65536, 100000] in blocks of 1024, the last one shorter.
  CHECK(bootstrap_block_lengths(length_bucket_edges(100000)).back() == 1024);
  const auto e4k = length_bucket_edges(4096);  // 0, 64, 128, ..., 4096
  CHECK(bootstrap_block_length(e4k) == 8);
  CHECK(bootstrap_block_lengths(e4k) == std::vector<int64_t>{8, 8, 16, 32, 64, 64, 64});
  CHECK(bootstrap_block_lengths(length_bucket_edges(5)) == std::vector<int64_t>{1});
  for (const auto& edges : {e128k, e4k, length_bucket_edges(1025), length_bucket_edges(300)}) {
    const std::vector<int64_t> L = bootstrap_block_lengths(edges);
    for (std::size_t k = 0; k < L.size(); ++k) {
      CAPTURE(edges[k + 1]);
      CHECK(L[k] % bootstrap_block_length(edges) == 0);       // runs of stored blocks
      CHECK(edges[k] % bootstrap_block_length(edges) == 0);   // that start at the bucket's start
    }
  }
}

TEST_CASE("block bootstrap over books keeps them apart; NaN where undefined; the spreads") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 103);
  boost::random::normal_distribution<double> normal(0.0, 1.0);
  const int64_t n = 4096;  // e = 64, blocks of 8
  std::vector<double> v0(static_cast<std::size_t>(n)), v1(static_cast<std::size_t>(n));
  for (std::size_t t = 0; t < v0.size(); ++t) {
    v0[t] = 0.5 + 0.1 * normal(rng);
    v1[t] = 2.0 + 0.1 * normal(rng);  // another book, another level
  }
  const KlStats b0 = stats_of(v0), b1 = stats_of(v1);
  const BlockSums* both[2] = {&b0.blocks, &b1.blocks};
  const StandardErrors pooled = block_bootstrap(both, b0.edges);
  // Stratified: each book keeps its own number of positions in every replicate, so the level
  // difference between the books adds nothing: SE = sqrt(SE0^2 + SE1^2) / 2 of the pooled mean.
  const double se0 = bootstrap_mean_se(b0), se1 = bootstrap_mean_se(b1);
  CHECK(pooled.mean_kl == doctest::Approx(std::sqrt(se0 * se0 + se1 * se1) / 2).epsilon(0.15));
  CHECK(pooled.mean_kl < 0.01);  // pooling the two books as one would give ~0.75 / sqrt(512 blocks) = 0.033

  // One block has no spread to measure: NaN, never 0. n = 1025: edges ..., 1024, 1025, blocks of 2,
  // the last bucket holds one position, one block.
  std::vector<double> v(1025);
  for (auto& x : v) x = 1.0 + 0.1 * normal(rng);
  const KlStats short_last = stats_of(v);
  REQUIRE(short_last.edges.end()[-2] == 1024);
  const BlockSums* sl = &short_last.blocks;
  const StandardErrors e = block_bootstrap(std::span<const BlockSums* const>(&sl, 1), short_last.edges);
  CHECK(std::isnan(e.bucket_mean.back()));
  CHECK(std::isfinite(e.bucket_mean.front()));
  CHECK(std::isfinite(e.mean_kl));
  const KlStats tiny = stats_of({0.1});  // one position, one block
  const BlockSums* t = &tiny.blocks;
  const StandardErrors none = block_bootstrap(std::span<const BlockSums* const>(&t, 1), tiny.edges);
  CHECK(std::isnan(none.mean_kl));
  CHECK(std::isnan(none.bucket_mean[0]));
  CHECK_THROWS_AS(block_bootstrap(both, tiny.edges), std::invalid_argument);  // blocks of another N

  // A merge pools the sums, leaves the blocks (strata) to the bootstrap, and drops what it cannot pool.
  KlStats m = b0;
  m.merge(b1);
  CHECK(m.kl_sum == b0.kl_sum + b1.kl_sum);
  CHECK(m.bucket_target_count[0] == b0.bucket_target_count[0] + b1.bucket_target_count[0]);
  CHECK(std::all_of(m.blocks.count.begin(), m.blocks.count.end(), [](int64_t c) { return c == 0; }));
  CHECK(std::isnan(m.se.mean_kl));
  CHECK(std::isnan(m.bucket_pct[0].value[0]));

  // The spread of estimates: sd (n - 1) / sqrt(n) over the finite ones.
  const std::vector<double> means = {1.0, 2.0, 4.0, NAN};
  const double mu = 7.0 / 3.0;
  const double sd = std::sqrt(((1 - mu) * (1 - mu) + (2 - mu) * (2 - mu) + (4 - mu) * (4 - mu)) / 2);
  CHECK(spread_standard_error(means) == doctest::Approx(sd / std::sqrt(3.0)).epsilon(1e-15));
  CHECK(std::isnan(spread_standard_error(std::vector<double>{1.0})));
}

TEST_CASE("the statistics table: mean KL +- SE, spreads, p99, RMS dp, top-1 +- SE, PPL ratio +- SE in 120 columns") {
  boost::random::mt19937_64 rng(replayssm::test::kBaseSeed + 104);
  boost::random::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(4096);
  for (auto& x : v) x = 0.002 + 0.0005 * normal(rng);
  KlStats s = stats_of(v);
  const BlockSums* one = &s.blocks;
  s.se = block_bootstrap(std::span<const BlockSums* const>(&one, 1), s.edges);
  s.mean_kl_book_se = 1.25e-4;
  KlStats undefined(s.edges);  // nothing finite: every value '-'
  const std::string name(34, 'p'), longer(40, 'q');
  const std::string t = format_statistics_table({{name, s}, {longer, undefined}});
  std::size_t line_start = 0;
  int lines = 0;
  while (line_start < t.size()) {
    const std::size_t end = t.find('\n', line_start);
    std::size_t columns = 0;  // code points: bytes that do not continue a UTF-8 sequence
    for (std::size_t i = line_start; i < end; ++i) columns += (static_cast<unsigned char>(t[i]) & 0xC0) != 0x80;
    CAPTURE(t.substr(line_start, end - line_start));
    CHECK(columns <= 120);
    line_start = end + 1;
    ++lines;
  }
  CHECK(lines == 2 + 2 + 4);  // header, rule, two rows, four lines of notes
  CHECK(test::contains(t, name + " "));
  CHECK(test::contains(t, std::string(33, 'q') + "~"));  // cut, marked
  CHECK(test::contains(t, fmt::format("{:.3g}±{:.2g}", s.mean_kl(), s.se.mean_kl)));
  CHECK(test::contains(t, " 0.000125 "));  // the spread over books
  CHECK(test::contains(t, "1.0000±0"));    // top-1: all agree, no spread
  const std::string last_row = t.substr(t.find(std::string(33, 'q')));
  CHECK(last_row.substr(0, last_row.find('\n')).find_first_not_of("q~ -") == std::string::npos);
}
