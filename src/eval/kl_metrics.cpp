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

KlStats::KlStats(std::vector<int64_t> bucket_edges)
    : edges(std::move(bucket_edges)),
      bucket_sum(edges.empty() ? 0 : edges.size() - 1, 0.0),
      bucket_count(edges.empty() ? 0 : edges.size() - 1, 0) {
  pct.value.fill(kNaN);
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
  bucket_sum[k] += r.kl;
  ++bucket_count[k];
  kl_sum += r.kl;
  top1_agree += r.top1_agree;
  if (r.has_target) {
    ++delta_p_count;
    delta_p_sum += r.delta_p;
  }
}

void KlStats::merge(const KlStats& o) {
  if (o.edges != edges) throw std::invalid_argument("KlStats::merge: different length buckets");
  for (std::size_t k = 0; k < bucket_sum.size(); ++k) {
    bucket_sum[k] += o.bucket_sum[k];
    bucket_count[k] += o.bucket_count[k];
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
  pct.value.fill(kNaN);
}

double KlStats::mean_kl() const { return finite_positions ? kl_sum / static_cast<double>(finite_positions) : kNaN; }
double KlStats::top1() const {
  return finite_positions ? static_cast<double>(top1_agree) / static_cast<double>(finite_positions) : kNaN;
}
double KlStats::mean_delta_p() const {
  return delta_p_count ? delta_p_sum / static_cast<double>(delta_p_count) : kNaN;
}
std::vector<double> KlStats::bucket_mean() const {
  std::vector<double> m(bucket_sum.size());
  for (std::size_t k = 0; k < m.size(); ++k)
    m[k] = bucket_count[k] ? bucket_sum[k] / static_cast<double>(bucket_count[k]) : kNaN;
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
  return s;
}

}  // namespace replayssm::eval
