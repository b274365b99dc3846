#include "eval/kl_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

namespace replayssm::eval {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Runs f(i) for i in [0, n) on up to `threads` threads, contiguous ranges per thread.
template <class F>
void parallel_for(int64_t n, int threads, F&& f) {
  if (threads <= 1 || n < 2) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  const int t_count = static_cast<int>(std::min<int64_t>(threads, n));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(t_count));
  for (int t = 0; t < t_count; ++t) {
    const int64_t lo = n * t / t_count, hi = n * (t + 1) / t_count;
    pool.emplace_back([&f, lo, hi] {
      for (int64_t i = lo; i < hi; ++i) f(i);
    });
  }
  for (auto& th : pool) th.join();
}

}  // namespace

std::vector<int64_t> length_bucket_edges(int64_t n) {
  if (n <= 0) return {0};
  int64_t e = 1;
  while (e * 2 <= n / 64) e *= 2;
  e = std::clamp<int64_t>(e, 16, 1024);
  std::vector<int64_t> edges{0};
  for (int64_t x = e; x < n; x *= 2) edges.push_back(x);
  edges.push_back(n);
  return edges;
}

int bucket_of(const std::vector<int64_t>& edges, int64_t length) {
  if (edges.size() < 2 || length < 1 || length > edges.back())
    throw std::out_of_range(fmt::format("length {} outside the buckets (0, {}]", length,
                                        edges.empty() ? 0 : edges.back()));
  // First edge >= length is edges[k + 1].
  const auto it = std::lower_bound(edges.begin() + 1, edges.end(), length);
  return static_cast<int>(it - edges.begin()) - 1;
}

namespace {

// |G/W - 1| below this: the row pair is close (see finish_position).
constexpr double kCloseRatio = 0.0625;

// log1p(v) - v without cancellation: -v^2 sum_k (-v)^k / (k + 2), to v^14/16 (truncation below
// 2e-19 relative for |v| < 1/16); log1p(v) - v directly outside.
double log1p_minus_x(double v) {
  if (!(std::abs(v) < kCloseRatio)) return std::log1p(v) - v;
  double q = 1.0 / 16.0;
  for (int k = 13; k >= 0; --k) q = q * -v + 1.0 / (k + 2);
  return -v * v * q;
}

// Pass-2 sums run over blocks of this many entries, then over the block sums: the rounding error
// of a sum of n terms grows like sqrt(n) ulps sequentially, ~sqrt(1024) + sqrt(n / 1024) blocked
// (the GPU sums per thread, then over a tree; both stay near 1e-15 relative at vocab 262144).
constexpr int kSumBlock = 1024;

// Both passes of one row pair, in index order.
kl::RowSums row_sums(const float* ref, const float* cfg, int vocab, int32_t target) {
  kl::RowSums s;
  s.scan = kl::scan_init();
  for (int i = 0; i < vocab; ++i) kl::scan_element(s.scan, i, ref[i], cfg[i]);
  s.sums = kl::sum_init();
  s.anchor = 0.0;
  s.target = target;
  s.ref_target = target >= 0 ? ref[target] : 0.0f;
  s.cfg_target = target >= 0 ? cfg[target] : 0.0f;
  if (kl::scan_valid(s.scan)) {
    s.anchor = kl::choose_anchor(s.scan, cfg[s.scan.ref_arg]);
    const double ref_max = s.scan.ref_max, shift = ref_max - s.anchor;
    for (int b0 = 0; b0 < vocab; b0 += kSumBlock) {
      kl::SumState block = kl::sum_init();
      for (int i = b0, end = std::min(vocab, b0 + kSumBlock); i < end; ++i)
        kl::sum_element(block, ref_max, s.anchor, shift, ref[i], cfg[i]);
      kl::sum_merge(s.sums, block);
    }
  }
  return s;
}

}  // namespace

PositionResult finish_position(const kl::RowSums& s) {
  PositionResult r;
  r.nonfinite_values = s.scan.nonfinite;
  if (s.scan.ref_bad || s.scan.ref_arg < 0) {
    r.ref_finite = false;
    r.finite = false;
    r.kl = kNaN;
    return r;
  }
  if (s.scan.cfg_bad || s.scan.cfg_arg < 0) {
    r.finite = false;
    r.kl = kNaN;
    return r;
  }
  const kl::SumState& m = s.sums;
  // W >= 1 (w = 1 at the reference's argmax) and G >= 1 (exp(max cfg - anchor) >= 1); G/W = 1 + v.
  const double W = m.w_sum, G = m.cfg_ref + m.cfg_rest, ratio = G / W;
  // Close rows: v from the sums of kl_terms.h, free of the rounding of ratio - 1 (v ~ 0 there).
  // It needs every w > 0 entry in F and A, i.e. no cfg = -Inf where p_ref > 0.
  const bool close = !m.cfg_zero && std::abs(ratio - 1.0) < kCloseRatio;
  const double v = close ? (m.f_sum - m.e_sum + m.cfg_rest) / W : ratio - 1.0;
  if (m.cfg_zero)
    r.kl = kInf;
  else if (ratio <= 2.0)  // KL = F/W + G0/W + log1p(v) - v: cancels only ~v^2/2, not O(1) normalisers
    r.kl = m.f_sum / W + m.cfg_rest / W + log1p_minus_x(v);
  else  // cfg's mass far above the anchor's scale: F ~ G, use KL = A/W + log(G/W) instead
    r.kl = m.e_sum / W + std::log(ratio);
  r.top1_agree = s.scan.ref_arg == s.scan.cfg_arg;
  r.has_target = s.target >= 0;
  if (r.has_target) {
    const double ref_max = s.scan.ref_max, rt = s.ref_target, ct = s.cfg_target;
    // log p = (value - the row's shift) - log(normaliser); well conditioned, no series needed.
    r.ref_logp_target = (rt - ref_max) - std::log(W);
    r.cfg_logp_target = (ct - s.anchor) - std::log(G);
    const double p = std::exp(rt - ref_max) / W;
    if (close && p > 0.0 && ct > -kInf) {
      // q/p = exp(-e_t) W/G: delta_p = p expm1(-e_t - log1p(v)) keeps its digits when q ~ p.
      const double e_t = (rt - ct) - (ref_max - s.anchor);
      r.delta_p = p * std::expm1(-e_t - std::log1p(v));
    } else {
      r.delta_p = std::exp(ct - s.anchor) / G - p;
    }
  }
  if (!std::isfinite(r.kl)) r.finite = false;
  return r;
}

PositionResult compare_position(const float* ref, const float* cfg, int vocab, int32_t target) {
  if (target >= vocab)
    throw std::invalid_argument(
        fmt::format("compare_position: target token {} is not below the vocabulary size {}", target, vocab));
  return finish_position(row_sums(ref, cfg, vocab, target));
}

void compare_positions(const float* ref, const float* cfg, int64_t rows, int vocab, int64_t ld, const int32_t* targets,
                       PositionResult* out, int threads) {
  if (rows < 0) throw std::invalid_argument(fmt::format("compare_positions: {} rows", rows));
  if (vocab < 1) throw std::invalid_argument(fmt::format("compare_positions: vocabulary size {} (expected >= 1)", vocab));
  if (ld < vocab)
    throw std::invalid_argument(
        fmt::format("compare_positions: leading dimension {} is below the vocabulary size {}", ld, vocab));
  for (int64_t i = 0; i < rows; ++i)
    if (targets[i] >= vocab)
      throw std::invalid_argument(fmt::format(
          "compare_positions: target token {} of row {} is not below the vocabulary size {}", targets[i], i, vocab));
  const int t_count = static_cast<int>(std::clamp<int64_t>(rows / 8, 1, std::max(1, threads)));
  parallel_for(rows, t_count, [&](int64_t i) {
    out[i] = finish_position(row_sums(ref + i * ld, cfg + i * ld, vocab, targets[i]));
  });
}

Percentiles percentiles(std::span<const float> values) {
  std::vector<double> x;
  x.reserve(values.size());
  for (float v : values)
    if (std::isfinite(v)) x.push_back(v);
  Percentiles p;
  if (x.empty()) {
    p.value.fill(kNaN);
    return p;
  }
  std::sort(x.begin(), x.end());
  const auto n = static_cast<double>(x.size());
  for (std::size_t k = 0; k < Percentiles::kLevels.size(); ++k) {
    // numpy "linear": virtual index (q / 100) * (n - 1), lerp written as numpy's _lerp.
    const double h = (Percentiles::kLevels[k] / 100.0) * (n - 1.0);
    const double lo_f = std::floor(h);
    const auto lo = static_cast<std::size_t>(lo_f);
    const std::size_t hi = std::min(lo + 1, x.size() - 1);
    const double t = h - lo_f;
    const double a = x[lo], b = x[hi], d = b - a;
    p.value[k] = t >= 0.5 ? b - d * (1.0 - t) : a + d * t;
  }
  return p;
}

int64_t bootstrap_block_length(const std::vector<int64_t>& edges) {
  return edges.size() < 2 ? 1 : std::max<int64_t>(1, edges[1] / 8);
}

std::vector<int64_t> bootstrap_block_lengths(const std::vector<int64_t>& edges) {
  const int64_t b = bootstrap_block_length(edges), e = edges.size() < 2 ? 1 : edges[1];
  std::vector<int64_t> lengths;
  for (std::size_t k = 0; k + 1 < edges.size(); ++k) {
    // size / 8 rounded down to a multiple of b (sizes are e 2^j but for the last bucket).
    const int64_t eighth = (edges[k + 1] - edges[k]) / 8 / b * b;
    lengths.push_back(std::clamp<int64_t>(eighth, b, std::max(b, e)));
  }
  return lengths;
}

StandardErrors::StandardErrors(std::size_t buckets)
    : mean_kl(kNaN),
      top1(kNaN),
      ppl_ratio(kNaN),
      bucket_mean(buckets, kNaN),
      bucket_top1(buckets, kNaN),
      bucket_ppl_ratio(buckets, kNaN) {}

namespace {

// splitmix64 (Steele, Lea, Flood 2014): a fixed, portable stream (std:: distributions are not).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
  }
  // Uniform on [0, n), without bias (Lemire 2019: multiply, reject the short low range).
  uint64_t below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

// Sample standard deviation (n - 1) of the finite values; NaN with fewer than 2.
double sample_sd(std::span<const double> x) {
  double sum = 0.0;
  int64_t n = 0;
  for (double v : x)
    if (std::isfinite(v)) sum += v, ++n;
  if (n < 2) return kNaN;
  const double mean = sum / static_cast<double>(n);
  double ss = 0.0;
  for (double v : x)
    if (std::isfinite(v)) ss += (v - mean) * (v - mean);
  return std::sqrt(ss / static_cast<double>(n - 1));
}

// Pooled sums of one replicate (or of one bucket of it).
struct Pool {
  int64_t count = 0, top1 = 0, targets = 0;
  double kl = 0.0, logratio = 0.0;
  void add(const BlockSums& b, std::size_t j) {
    count += b.count[j];
    top1 += b.top1_agree[j];
    targets += b.target_count[j];
    kl += b.kl_sum[j];
    logratio += b.logratio_sum[j];
  }
  void add(const Pool& o) {
    count += o.count, top1 += o.top1, targets += o.targets;
    kl += o.kl, logratio += o.logratio;
  }
  double mean_kl() const { return count ? kl / static_cast<double>(count) : kNaN; }
  double top1_share() const { return count ? static_cast<double>(top1) / static_cast<double>(count) : kNaN; }
  double ppl_ratio() const { return targets ? std::exp(logratio / static_cast<double>(targets)) : kNaN; }
};

}  // namespace

StandardErrors block_bootstrap(std::span<const BlockSums* const> strata, const std::vector<int64_t>& edges,
                               int resamples, uint64_t seed) {
  const std::size_t K = edges.empty() ? 0 : edges.size() - 1;
  StandardErrors se(K);
  if (K == 0 || resamples < 2) return se;
  const int64_t b = bootstrap_block_length(edges), n = edges.back();
  const auto n_blocks = static_cast<std::size_t>((n + b - 1) / b);
  const std::vector<int64_t> lengths = bootstrap_block_lengths(edges);
  // blocks_of[s][k]: the blocks of stratum s in bucket k, each the sums over its run of base blocks.
  std::vector<std::vector<std::vector<Pool>>> blocks_of(strata.size(), std::vector<std::vector<Pool>>(K));
  std::vector<std::size_t> blocks_in_bucket(K, 0);
  for (std::size_t s = 0; s < strata.size(); ++s) {
    const BlockSums& bs = *strata[s];
    if (bs.block_length != b || bs.size() != n_blocks || bs.kl_sum.size() != n_blocks ||
        bs.top1_agree.size() != n_blocks || bs.target_count.size() != n_blocks || bs.logratio_sum.size() != n_blocks)
      throw std::invalid_argument(fmt::format("block_bootstrap: stratum {} holds {} blocks of {} positions, expected "
                                              "{} of {} for N = {}",
                                              s, bs.size(), bs.block_length, n_blocks, b, n));
    for (std::size_t k = 0; k < K; ++k) {
      const auto run = static_cast<std::size_t>(lengths[k] / b);
      const auto first = static_cast<std::size_t>(edges[k] / b), end = static_cast<std::size_t>((edges[k + 1] + b - 1) / b);
      for (std::size_t j0 = first; j0 < end; j0 += run) {
        Pool block;
        for (std::size_t j = j0; j < std::min(end, j0 + run); ++j) block.add(bs, j);
        blocks_of[s][k].push_back(block);
      }
      blocks_in_bucket[k] += blocks_of[s][k].size();
    }
  }
  const auto R = static_cast<std::size_t>(resamples);
  std::vector<std::vector<double>> rep_kl(K, std::vector<double>(R)), rep_top1 = rep_kl, rep_ppl = rep_kl;
  std::vector<double> all_kl(R), all_top1(R), all_ppl(R);
  SplitMix64 rng{seed};
  for (std::size_t r = 0; r < R; ++r) {
    Pool all;
    for (std::size_t k = 0; k < K; ++k) {
      Pool bucket;
      for (std::size_t s = 0; s < strata.size(); ++s) {
        const std::vector<Pool>& blocks = blocks_of[s][k];
        for (std::size_t i = 0; i < blocks.size(); ++i) bucket.add(blocks[rng.below(blocks.size())]);
      }
      rep_kl[k][r] = bucket.mean_kl();
      rep_top1[k][r] = bucket.top1_share();
      rep_ppl[k][r] = bucket.ppl_ratio();
      all.add(bucket);
    }
    all_kl[r] = all.mean_kl();
    all_top1[r] = all.top1_share();
    all_ppl[r] = all.ppl_ratio();
  }
  std::size_t total_blocks = 0;
  for (std::size_t k = 0; k < K; ++k) {
    total_blocks += blocks_in_bucket[k];
    if (blocks_in_bucket[k] < 2) continue;  // one block resampled is itself: no spread to measure
    se.bucket_mean[k] = sample_sd(rep_kl[k]);
    se.bucket_top1[k] = sample_sd(rep_top1[k]);
    se.bucket_ppl_ratio[k] = sample_sd(rep_ppl[k]);
  }
  if (total_blocks >= 2) {
    se.mean_kl = sample_sd(all_kl);
    se.top1 = sample_sd(all_top1);
    se.ppl_ratio = sample_sd(all_ppl);
  }
  return se;
}

double spread_standard_error(std::span<const double> values) {
  const double sd = sample_sd(values);
  int64_t n = 0;
  for (double v : values) n += std::isfinite(v) ? 1 : 0;
  return std::isnan(sd) ? kNaN : sd / std::sqrt(static_cast<double>(n));
}

KlStats::KlStats(std::vector<int64_t> bucket_edges)
    : edges(std::move(bucket_edges)),
      bucket_sum(edges.empty() ? 0 : edges.size() - 1, 0.0),
      bucket_count(bucket_sum.size(), 0),
      bucket_top1_agree(bucket_sum.size(), 0),
      bucket_target_count(bucket_sum.size(), 0),
      bucket_delta_p_sq_sum(bucket_sum.size(), 0.0),
      bucket_logratio_sum(bucket_sum.size(), 0.0),
      bucket_pct(bucket_sum.size()),
      se(bucket_sum.size()),
      mean_kl_book_se(kNaN),
      bucket_mean_book_se(bucket_sum.size(), kNaN),
      mean_kl_seed_se(kNaN),
      bucket_mean_seed_se(bucket_sum.size(), kNaN) {
  pct.value.fill(kNaN);
  for (Percentiles& p : bucket_pct) p.value.fill(kNaN);
  blocks.block_length = bootstrap_block_length(edges);
  const int64_t n = edges.empty() ? 0 : edges.back();
  const auto n_blocks = static_cast<std::size_t>((n + blocks.block_length - 1) / blocks.block_length);
  blocks.count.assign(n_blocks, 0);
  blocks.kl_sum.assign(n_blocks, 0.0);
  blocks.top1_agree.assign(n_blocks, 0);
  blocks.target_count.assign(n_blocks, 0);
  blocks.logratio_sum.assign(n_blocks, 0.0);
}

void KlStats::add(int64_t position, const PositionResult& r) {
  ++positions;
  nonfinite_values += r.nonfinite_values;
  if (!r.finite) {
    ++nonfinite_positions;
    if (!r.ref_finite) ++ref_nonfinite_positions;
    return;
  }
  ++finite_positions;
  const auto k = static_cast<std::size_t>(bucket_of(edges, position + 1));
  const auto j = static_cast<std::size_t>(position / blocks.block_length);
  bucket_sum[k] += r.kl;
  ++bucket_count[k];
  kl_sum += r.kl;
  top1_agree += r.top1_agree;
  bucket_top1_agree[k] += r.top1_agree;
  ++blocks.count[j];
  blocks.kl_sum[j] += r.kl;
  blocks.top1_agree[j] += r.top1_agree;
  if (r.has_target) {
    const double logratio = r.ref_logp_target - r.cfg_logp_target;
    ++delta_p_count;
    delta_p_sum += r.delta_p;
    delta_p_sq_sum += r.delta_p * r.delta_p;
    logratio_sum += logratio;
    ref_nll_sum -= r.ref_logp_target;
    ++bucket_target_count[k];
    bucket_delta_p_sq_sum[k] += r.delta_p * r.delta_p;
    bucket_logratio_sum[k] += logratio;
    ++blocks.target_count[j];
    blocks.logratio_sum[j] += logratio;
  }
}

void KlStats::merge(const KlStats& o) {
  if (o.edges != edges) throw std::invalid_argument("KlStats::merge: different length buckets");
  for (std::size_t k = 0; k < bucket_sum.size(); ++k) {
    bucket_sum[k] += o.bucket_sum[k];
    bucket_count[k] += o.bucket_count[k];
    bucket_top1_agree[k] += o.bucket_top1_agree[k];
    bucket_target_count[k] += o.bucket_target_count[k];
    bucket_delta_p_sq_sum[k] += o.bucket_delta_p_sq_sum[k];
    bucket_logratio_sum[k] += o.bucket_logratio_sum[k];
  }
  positions += o.positions;
  finite_positions += o.finite_positions;
  nonfinite_positions += o.nonfinite_positions;
  ref_nonfinite_positions += o.ref_nonfinite_positions;
  nonfinite_values += o.nonfinite_values;
  top1_agree += o.top1_agree;
  delta_p_count += o.delta_p_count;
  kl_sum += o.kl_sum;
  delta_p_sum += o.delta_p_sum;
  delta_p_sq_sum += o.delta_p_sq_sum;
  logratio_sum += o.logratio_sum;
  ref_nll_sum += o.ref_nll_sum;
  bucket_top1_known = bucket_top1_known && o.bucket_top1_known;
  // What is not a sum is recomputed from the stored values by whoever merges (the cell store).
  const KlStats fresh(edges);
  blocks = fresh.blocks;
  pct = fresh.pct;
  bucket_pct = fresh.bucket_pct;
  se = fresh.se;
}

namespace {
double ratio_or_nan(double num, int64_t den) { return den ? num / static_cast<double>(den) : kNaN; }
}  // namespace

double KlStats::mean_kl() const { return ratio_or_nan(kl_sum, finite_positions); }
double KlStats::top1() const { return ratio_or_nan(static_cast<double>(top1_agree), finite_positions); }
double KlStats::mean_delta_p() const { return ratio_or_nan(delta_p_sum, delta_p_count); }
double KlStats::rms_delta_p() const { return std::sqrt(ratio_or_nan(delta_p_sq_sum, delta_p_count)); }
double KlStats::ppl_ratio() const { return std::exp(ratio_or_nan(logratio_sum, delta_p_count)); }
double KlStats::ref_ppl() const { return std::exp(ratio_or_nan(ref_nll_sum, delta_p_count)); }
double KlStats::ppl() const { return std::exp(ratio_or_nan(ref_nll_sum + logratio_sum, delta_p_count)); }
std::vector<double> KlStats::bucket_mean() const {
  std::vector<double> m(bucket_sum.size());
  for (std::size_t k = 0; k < m.size(); ++k) m[k] = ratio_or_nan(bucket_sum[k], bucket_count[k]);
  return m;
}
std::vector<double> KlStats::bucket_top1() const {
  std::vector<double> m(bucket_sum.size());
  for (std::size_t k = 0; k < m.size(); ++k)
    m[k] = bucket_top1_known ? ratio_or_nan(static_cast<double>(bucket_top1_agree[k]), bucket_count[k]) : kNaN;
  return m;
}
std::vector<double> KlStats::bucket_rms_delta_p() const {
  std::vector<double> m(bucket_sum.size());
  for (std::size_t k = 0; k < m.size(); ++k)
    m[k] = std::sqrt(ratio_or_nan(bucket_delta_p_sq_sum[k], bucket_target_count[k]));
  return m;
}
std::vector<double> KlStats::bucket_ppl_ratio() const {
  std::vector<double> m(bucket_sum.size());
  for (std::size_t k = 0; k < m.size(); ++k)
    m[k] = std::exp(ratio_or_nan(bucket_logratio_sum[k], bucket_target_count[k]));
  return m;
}

CellAccumulator::CellAccumulator(int64_t n_positions, std::vector<int64_t> edges, int threads)
    : n_(n_positions),
      threads_(threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      kl_(static_cast<std::size_t>(n_positions), std::numeric_limits<float>::quiet_NaN()),
      seen_(static_cast<std::size_t>(n_positions), 0),
      stats_(std::move(edges)) {
  if (n_positions < 0) throw std::invalid_argument("CellAccumulator: negative number of positions");
  if (stats_.edges.empty() || stats_.edges.back() != n_positions)
    throw std::invalid_argument(fmt::format("CellAccumulator: bucket edges must end at n = {}", n_positions));
}

void CellAccumulator::check_unseen(int64_t first, int64_t rows) const {
  if (first < 0 || rows < 0 || first + rows > n_)
    throw std::invalid_argument(fmt::format("KL chunk: positions [{}, {}) outside [0, {})", first, first + rows, n_));
  for (int64_t i = 0; i < rows; ++i)
    if (seen_[static_cast<std::size_t>(first + i)])
      throw std::invalid_argument(fmt::format("KL chunk: position {} added twice", first + i));
}

void CellAccumulator::add_chunk(int64_t first, const Eigen::Ref<const LogProbRows>& ref,
                                const Eigen::Ref<const LogProbRows>& cfg, std::span<const int32_t> targets) {
  const int64_t rows = ref.rows();
  if (cfg.rows() != rows || cfg.cols() != ref.cols())
    throw std::invalid_argument(fmt::format("KL chunk: reference log-probs are {}x{}, configuration {}x{}", rows,
                                            ref.cols(), cfg.rows(), cfg.cols()));
  if (static_cast<int64_t>(targets.size()) != rows)
    throw std::invalid_argument(fmt::format("KL chunk: {} rows but {} targets", rows, targets.size()));
  if (ref.cols() > std::numeric_limits<int>::max())
    throw std::invalid_argument(fmt::format("KL chunk: vocabulary size {} above {}", ref.cols(),
                                            std::numeric_limits<int>::max()));
  check_unseen(first, rows);
  if (rows == 0) return;
  results_.resize(static_cast<std::size_t>(rows));
  const auto vocab = static_cast<int>(ref.cols());
  // Rows of a row-major Eigen::Ref are outerStride() floats apart; one call when both strides agree.
  if (ref.outerStride() == cfg.outerStride()) {
    compare_positions(ref.data(), cfg.data(), rows, vocab, ref.outerStride(), targets.data(), results_.data(), threads_);
  } else {
    for (int64_t i = 0; i < rows; ++i)
      compare_positions(ref.row(i).data(), cfg.row(i).data(), 1, vocab, vocab, &targets[static_cast<std::size_t>(i)],
                        &results_[static_cast<std::size_t>(i)]);
  }
  add_results(first, results_);
}

void CellAccumulator::add_results(int64_t first, std::span<const PositionResult> results) {
  const auto rows = static_cast<int64_t>(results.size());
  check_unseen(first, rows);
  for (int64_t i = 0; i < rows; ++i) {
    const PositionResult& r = results[static_cast<std::size_t>(i)];
    const auto p = static_cast<std::size_t>(first + i);
    kl_[p] = static_cast<float>(r.kl);
    seen_[p] = 1;
    stats_.add(first + i, r);
  }
  added_ += rows;
}

KlStats CellAccumulator::finish() const {
  if (!complete())
    throw std::logic_error(fmt::format("CellAccumulator::finish: {} of {} positions added", added_, n_));
  KlStats s = stats_;
  s.pct = percentiles(kl_);
  for (std::size_t k = 0; k + 1 < s.edges.size(); ++k)  // bucket k: positions [edges[k], edges[k + 1])
    s.bucket_pct[k] = percentiles(std::span<const float>(kl_).subspan(
        static_cast<std::size_t>(s.edges[k]), static_cast<std::size_t>(s.edges[k + 1] - s.edges[k])));
  const BlockSums* one = &s.blocks;
  s.se = block_bootstrap(std::span<const BlockSums* const>(&one, 1), s.edges);
  return s;
}

}  // namespace replayssm::eval
