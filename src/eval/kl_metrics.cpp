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
    for (int64_t i = 0; i < n; ++i) f(0, i);
    return;
  }
  const int t_count = static_cast<int>(std::min<int64_t>(threads, n));
  std::vector<std::thread> pool;
  pool.reserve(static_cast<std::size_t>(t_count));
  for (int t = 0; t < t_count; ++t) {
    const int64_t lo = n * t / t_count, hi = n * (t + 1) / t_count;
    pool.emplace_back([&f, t, lo, hi] {
      for (int64_t i = lo; i < hi; ++i) f(t, i);
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

PositionResult compare_position(const float* ref, const float* cfg, int vocab, int32_t target, double* scratch) {
  PositionResult r;
  double mr = -kInf, mc = -kInf;
  int ar = -1, ac = -1;
  bool bad_r = false, bad_c = false;
  for (int i = 0; i < vocab; ++i) {
    const double a = ref[i], c = cfg[i];
    if (std::isnan(a) || a == kInf) {
      bad_r = true;
    } else if (a > mr) {
      mr = a;
      ar = i;
    }
    if (!std::isfinite(c)) {
      ++r.nonfinite_values;
      if (std::isnan(c) || c == kInf) bad_c = true;
    } else if (c > mc) {
      mc = c;
      ac = i;
    }
  }
  if (bad_r || ar < 0) {
    r.ref_finite = false;
    r.finite = false;
    r.kl = kNaN;
    return r;
  }
  if (bad_c || ac < 0) {
    r.finite = false;
    r.kl = kNaN;
    return r;
  }
  double zr = 0.0, zc = 0.0;
  for (int i = 0; i < vocab; ++i) {
    const double e = std::exp(static_cast<double>(ref[i]) - mr);
    scratch[i] = e;
    zr += e;
    zc += std::exp(static_cast<double>(cfg[i]) - mc);
  }
  const double lse_r = mr + std::log(zr), lse_c = mc + std::log(zc);
  double kl = 0.0;
  for (int i = 0; i < vocab; ++i) {
    if (scratch[i] == 0.0) continue;  // p_ref = 0 contributes nothing
    const double p = scratch[i] / zr;
    kl += p * ((static_cast<double>(ref[i]) - lse_r) - (static_cast<double>(cfg[i]) - lse_c));
  }
  r.kl = kl;
  r.top1_agree = ar == ac;
  r.has_target = target >= 0;
  if (r.has_target)
    r.delta_p = std::exp(static_cast<double>(cfg[target]) - lse_c) - std::exp(static_cast<double>(ref[target]) - lse_r);
  if (!std::isfinite(kl)) r.finite = false;
  return r;
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

void CellAccumulator::add_chunk(int64_t first, const Eigen::Ref<const LogProbRows>& ref,
                                const Eigen::Ref<const LogProbRows>& cfg, std::span<const int32_t> targets) {
  const int64_t rows = ref.rows();
  const auto vocab = static_cast<int>(ref.cols());
  if (cfg.rows() != rows || cfg.cols() != ref.cols())
    throw std::invalid_argument(fmt::format("KL chunk: reference log-probs are {}x{}, configuration {}x{}", rows,
                                            ref.cols(), cfg.rows(), cfg.cols()));
  if (static_cast<int64_t>(targets.size()) != rows)
    throw std::invalid_argument(fmt::format("KL chunk: {} rows but {} targets", rows, targets.size()));
  if (first < 0 || first + rows > n_)
    throw std::invalid_argument(fmt::format("KL chunk: positions [{}, {}) outside [0, {})", first, first + rows, n_));
  for (int64_t i = 0; i < rows; ++i) {
    if (seen_[static_cast<std::size_t>(first + i)])
      throw std::invalid_argument(fmt::format("KL chunk: position {} added twice", first + i));
    if (targets[static_cast<std::size_t>(i)] >= vocab)
      throw std::invalid_argument(fmt::format("KL chunk: target token {} at position {} is not below the vocabulary "
                                              "size {}", targets[static_cast<std::size_t>(i)], first + i, vocab));
  }
  results_.resize(static_cast<std::size_t>(rows));
  const int threads = static_cast<int>(std::min<int64_t>(threads_, std::max<int64_t>(1, rows / 8)));
  if (static_cast<int>(scratch_.size()) < threads) scratch_.resize(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) scratch_[static_cast<std::size_t>(t)].resize(static_cast<std::size_t>(vocab));
  parallel_for(rows, threads, [&](int t, int64_t i) {
    results_[static_cast<std::size_t>(i)] =
        compare_position(ref.row(i).data(), cfg.row(i).data(), vocab, targets[static_cast<std::size_t>(i)],
                         scratch_[static_cast<std::size_t>(t)].data());
  });
  for (int64_t i = 0; i < rows; ++i) {
    const PositionResult& r = results_[static_cast<std::size_t>(i)];
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
