// cuda::compare_positions_gpu (cuda/eval/kl_positions.h) against its CPU twin
// eval::compare_positions on fresh random logit rows (fixed seeds): awkward vocabularies (1, 2, 7,
// 50257, 248320), 1, 3 and 1000 rows, dense and padded/misaligned layouts, close and far rows,
// ties, NaN/+-Inf in either row, targets -1. Booleans and counts must be equal; kl and delta_p
// within 1e-12 relative (+1e-300), delta_p of far rows within 1e-12 relative + 1e-13 (p_t + q_t)
// (q - p of two probabilities with ~1e-15 relative summation-order differences); non-finite kl of
// the same class; the target's log-probabilities (the perplexity ratio's terms) within 1e-12
// absolute (relative beyond 1) of the CPU's, and the CPU's of a float64 log-softmax. Also prints the achieved bandwidth beside a device-to-device copy's.
// Skips (exit 77) without a CUDA device.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "device_memory.h"
#include "eval/kl_metrics.h"
#include "eval/kl_positions.h"
#include "test_util.h"
#include "gpu_test_util.h"

using namespace replayssm;
using eval::PositionResult;

namespace {

const test::GpuGuard gpu_guard("KL comparison tests");

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Deterministic noise by index (fast enough for 5e8 values): splitmix64, four 16-bit uniforms
// summed (Irwin-Hall), scaled to unit variance.
uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double gauss(uint64_t seed, uint64_t i) {
  uint64_t h = splitmix(splitmix(seed) ^ i);
  double s = 0.0;
  for (int k = 0; k < 4; ++k, h >>= 16) s += static_cast<double>(h & 0xFFFFu) / 65536.0;
  return (s - 2.0) * 1.7320508075688772;
}

// rows x vocab logits in a row-major buffer of leading dimension ld; padding is NaN, so a kernel
// reading past the vocabulary shows.
struct HostRows {
  int64_t rows, vocab, ld;
  std::vector<float> v;
  HostRows(int64_t r, int64_t V, int64_t l) : rows(r), vocab(V), ld(l), v(static_cast<std::size_t>(r * l), kNaN) {}
  float& at(int64_t r, int64_t c) { return v[static_cast<std::size_t>(r * ld + c)]; }
  const float* row(int64_t r) const { return v.data() + r * ld; }
};

// A device copy starting `shift` floats into its allocation (1: rows off 16-byte alignment).
struct DeviceRows {
  cuda::DeviceBuffer<float> buf;
  cuda::ConstDeviceMatrix view;
  DeviceRows(const HostRows& h, int shift) : buf(h.v.size() + static_cast<std::size_t>(shift)) {
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(buf.data() + shift, h.v.data(), h.v.size() * sizeof(float), cudaMemcpyHostToDevice));
    view = cuda::ConstDeviceMatrix(buf.data() + shift, h.rows, h.vocab, h.ld);
  }
};

int host_threads() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

std::vector<PositionResult> cpu_results(const HostRows& ref, const HostRows& cfg, const std::vector<int32_t>& targets) {
  std::vector<PositionResult> out(static_cast<std::size_t>(ref.rows));
  eval::compare_positions(ref.v.data(), cfg.v.data(), ref.rows, static_cast<int>(ref.vocab), ref.ld, targets.data(),
                          out.data(), host_threads());
  return out;
}

std::vector<PositionResult> gpu_results(const HostRows& ref, const HostRows& cfg, const std::vector<int32_t>& targets,
                                        int shift) {
  const DeviceRows r(ref, shift), c(cfg, shift);
  cuda::DeviceBuffer<int32_t> t;
  t.upload(targets);
  std::vector<PositionResult> out(static_cast<std::size_t>(ref.rows));
  cuda::compare_positions_gpu(r.view, c.view, t.data(), out, nullptr);
  return out;
}

// p_ref(t) and p_cfg(t) in double, directly (scales the delta_p tolerance of far rows).
std::pair<double, double> target_probs(const float* r, const float* c, int64_t vocab, int32_t t) {
  const auto prob = [&](const float* x) {
    double m = -INFINITY, z = 0.0;
    for (int64_t i = 0; i < vocab; ++i) m = std::max(m, static_cast<double>(x[i]));
    for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(x[i]) - m);
    return std::exp(static_cast<double>(x[t]) - m) / z;
  };
  return {prob(r), prob(c)};
}

bool close_to(double got, double want, double allowed) {
  if (!std::isfinite(want)) return (std::isnan(want) && std::isnan(got)) || got == want;
  return std::isfinite(got) && std::abs(got - want) <= allowed;
}

// log p_ref(t) and log p_cfg(t) in double, directly in the log domain (x_t - max - log sum exp):
// the float64 oracle of the perplexity terms.
std::pair<double, double> target_logps(const float* r, const float* c, int64_t vocab, int32_t t) {
  const auto logp = [&](const float* x) {
    double m = -INFINITY, z = 0.0;
    for (int64_t i = 0; i < vocab; ++i) m = std::max(m, static_cast<double>(x[i]));
    for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(x[i]) - m);
    return (static_cast<double>(x[t]) - m) - std::log(z);
  };
  return {logp(r), logp(c)};
}

std::string describe(const PositionResult& p) {
  std::ostringstream s;
  s.precision(17);
  s << "kl " << p.kl << " delta_p " << p.delta_p << " has_target " << p.has_target << " top1 " << p.top1_agree
    << " finite " << p.finite << " ref_finite " << p.ref_finite << " nonfinite_values " << p.nonfinite_values
    << " ref_logp_target " << p.ref_logp_target << " cfg_logp_target " << p.cfg_logp_target;
  return s.str();
}

// A log-probability: the sums behind it differ by ~1e-15 relative between the twins (summation
// order), so log W by ~1e-15 absolute; 1e-12 absolute (relative beyond |x| = 1) is ample.
bool logp_close(double got, double want) { return close_to(got, want, 1e-12 * std::max(1.0, std::abs(want))); }

// Every field of every row; the first mismatches are listed with both results. dp_prob_atol:
// the delta_p allowance in units of p_t + q_t beyond 1e-12 relative (0: relative only).
void check_equal(const std::vector<PositionResult>& gpu, const std::vector<PositionResult>& cpu, const HostRows& ref,
                 const HostRows& cfg, const std::vector<int32_t>& targets, double dp_prob_atol, const std::string& what) {
  REQUIRE(gpu.size() == cpu.size());
  std::ostringstream report;
  int bad = 0;
  double worst_kl = 0.0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const PositionResult &g = gpu[i], &c = cpu[i];
    bool ok = g.finite == c.finite && g.ref_finite == c.ref_finite && g.has_target == c.has_target &&
              g.top1_agree == c.top1_agree && g.nonfinite_values == c.nonfinite_values &&
              close_to(g.kl, c.kl, 1e-12 * std::abs(c.kl) + 1e-300);
    if (std::isfinite(c.kl) && c.kl != 0.0) worst_kl = std::max(worst_kl, std::abs(g.kl - c.kl) / std::abs(c.kl));
    if (ok && !close_to(g.delta_p, c.delta_p, 1e-12 * std::abs(c.delta_p) + 1e-300)) {
      ok = dp_prob_atol > 0.0 && c.has_target;
      if (ok) {
        const auto [p, q] = target_probs(ref.row(static_cast<int64_t>(i)), cfg.row(static_cast<int64_t>(i)), ref.vocab,
                                         targets[i]);
        ok = close_to(g.delta_p, c.delta_p, 1e-12 * std::abs(c.delta_p) + dp_prob_atol * (p + q) + 1e-300);
      }
    }
    // The target's log-probabilities (perplexity ratio): GPU against CPU, and the CPU against the
    // float64 oracle where the position is finite (on non-finite positions both are unset, 0).
    ok = ok && logp_close(g.ref_logp_target, c.ref_logp_target) && logp_close(g.cfg_logp_target, c.cfg_logp_target);
    std::string oracle;
    if (ok && c.finite && c.has_target) {
      const auto [lp, lq] = target_logps(ref.row(static_cast<int64_t>(i)), cfg.row(static_cast<int64_t>(i)), ref.vocab,
                                         targets[i]);
      if (!logp_close(c.ref_logp_target, lp) || !logp_close(c.cfg_logp_target, lq)) {
        ok = false;
        std::ostringstream o;
        o.precision(17);
        o << "\n    float64 oracle: ref_logp_target " << lp << " cfg_logp_target " << lq;
        oracle = o.str();
      }
    }
    if (!ok && ++bad <= 5)
      report << "\n  row " << i << ":\n    gpu " << describe(g) << "\n    cpu " << describe(c) << oracle;
  }
  INFO(what << ": " << bad << " of " << cpu.size() << " rows differ (max relative kl difference " << worst_kl << ")"
            << report.str());
  CHECK(bad == 0);
}

// Row kinds of the random test: the configuration row as a function of the reference row.
void fill_pair(HostRows& ref, HostRows& cfg, std::vector<int32_t>& targets, uint64_t seed) {
  const int64_t V = ref.vocab;
  targets.resize(static_cast<std::size_t>(ref.rows));
  for (int64_t i = 0; i < ref.rows; ++i) {
    const uint64_t base = static_cast<uint64_t>(i) * static_cast<uint64_t>(V);
    for (int64_t v = 0; v < V; ++v) ref.at(i, v) = static_cast<float>(3.0 * gauss(seed, base + v));
    for (int64_t v = 0; v < V; ++v) {
      const double r = ref.at(i, v), z = gauss(seed + 1, base + v);
      double c = r;
      switch (i % 8) {
        case 0: break;                                  // identical
        case 1: c = r + 1.4e-5 * z; break;              // KL ~ 1e-10
        case 2: c = r + 7.25 + 1e-3 * z; break;         // raw logits (offset), KL ~ 5e-7
        case 3: c = r + 0.3 * z; break;
        case 4: c = r + 3.0 * z; break;
        case 5: c = 3.0 * z; break;                     // independent
        case 6: c = r + 5.5; break;                     // offset only: KL of the float rounding
        default: c = 20.0 * z; break;                   // independent and peaked
      }
      cfg.at(i, v) = static_cast<float>(c);
    }
    targets[static_cast<std::size_t>(i)] =
        i % 9 == 4 ? -1 : static_cast<int32_t>(splitmix(seed + 2 + static_cast<uint64_t>(i)) % static_cast<uint64_t>(V));
  }
}

}  // namespace

TEST_CASE("random logit rows: every field equals the CPU twin's, in dense and padded, misaligned layouts") {
  uint64_t seed = test::kBaseSeed + 100;
  for (int64_t vocab : {1, 2, 7, 50257, 248320}) {
    for (int64_t rows : {1, 3, 1000}) {
      for (int layout = 0; layout < 2; ++layout) {
        if (layout == 1 && rows == 1000 && vocab > 50257) continue;  // 2 GB more of the same
        const int64_t ld = layout == 0 ? vocab : vocab + 3;
        const int shift = layout;
        HostRows ref(rows, vocab, ld), cfg(rows, vocab, ld);
        std::vector<int32_t> targets;
        fill_pair(ref, cfg, targets, ++seed);
        const auto cpu = cpu_results(ref, cfg, targets);
        const auto gpu = gpu_results(ref, cfg, targets, shift);
        const std::string what = "vocab " + std::to_string(vocab) + ", rows " + std::to_string(rows) + ", ld " +
                                 std::to_string(ld) + ", offset " + std::to_string(shift);
        CAPTURE(what);
        check_equal(gpu, cpu, ref, cfg, targets, 1e-13, what);
        if (rows == 1000 && layout == 0) {  // fixed reduction order: bit-identical on a second run
          const auto again = gpu_results(ref, cfg, targets, shift);
          int differ = 0;
          for (std::size_t i = 0; i < gpu.size(); ++i)
            differ += std::memcmp(&gpu[i].kl, &again[i].kl, sizeof(double)) != 0 ||
                      std::memcmp(&gpu[i].delta_p, &again[i].delta_p, sizeof(double)) != 0 ||
                      std::memcmp(&gpu[i].ref_logp_target, &again[i].ref_logp_target, sizeof(double)) != 0 ||
                      std::memcmp(&gpu[i].cfg_logp_target, &again[i].cfg_logp_target, sizeof(double)) != 0;
          CHECK(differ == 0);
        }
      }
    }
  }
}

TEST_CASE("near-identical rows: a KL of 1e-10 is resolved (1e-12 relative to the CPU); identical rows give 0") {
  uint64_t seed = test::kBaseSeed + 200;
  for (int64_t vocab : {50257, 248320}) {
    const int64_t rows = 64;
    HostRows ref(rows, vocab, vocab), cfg(rows, vocab, vocab);
    std::vector<int32_t> targets(static_cast<std::size_t>(rows));
    ++seed;
    for (int64_t i = 0; i < rows; ++i) {
      const double offset = i % 2 ? 7.25 : 0.0, sigma = i % 4 == 0 ? 0.0 : 1.4e-5;  // i % 4 == 0: identical
      for (int64_t v = 0; v < vocab; ++v) {
        const uint64_t k = static_cast<uint64_t>(i * vocab + v);
        ref.at(i, v) = static_cast<float>(3.0 * gauss(seed, k));
        cfg.at(i, v) = static_cast<float>(ref.at(i, v) + offset + sigma * gauss(seed + 7, k));
      }
      targets[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7919) % vocab);
    }
    const auto cpu = cpu_results(ref, cfg, targets);
    const auto gpu = gpu_results(ref, cfg, targets, 0);
    check_equal(gpu, cpu, ref, cfg, targets, 0.0, "near-identical, vocab " + std::to_string(vocab));
    for (int64_t i = 0; i < rows; ++i) {
      CAPTURE(i);
      const PositionResult& g = gpu[static_cast<std::size_t>(i)];
      if (i % 4 == 0) {  // identical
        CHECK(g.kl == 0.0);
        CHECK(cpu[static_cast<std::size_t>(i)].kl == 0.0);
        CHECK(g.delta_p == 0.0);
        CHECK(g.top1_agree);
        CHECK(g.ref_logp_target == g.cfg_logp_target);  // perplexity ratio exactly 1
      } else if (i % 4 == 1) {  // KL ~ sigma^2 / 2 ~ 1e-10
        CHECK(g.kl > 1e-11);
        CHECK(g.kl < 1e-9);
      }
    }
  }
}

TEST_CASE("ties, NaN and +-Inf in either row, -inf where p_ref > 0, targets -1: the CPU's results") {
  uint64_t seed = test::kBaseSeed + 300;
  for (int64_t vocab : {7, 4096, 50257}) {
    const int64_t rows = 32, V = vocab;
    HostRows ref(rows, V, V), cfg(rows, V, V);
    std::vector<int32_t> targets(static_cast<std::size_t>(rows));
    ++seed;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t v = 0; v < V; ++v) {
        const uint64_t k = static_cast<uint64_t>(i * V + v);
        ref.at(i, v) = static_cast<float>(2.0 * gauss(seed, k));
        cfg.at(i, v) = static_cast<float>(ref.at(i, v) + 0.3 * gauss(seed + 5, k));
      }
      targets[static_cast<std::size_t>(i)] = static_cast<int32_t>((3 * i + 1) % V);
      float* r = &ref.at(i, 0);
      float* c = &cfg.at(i, 0);
      const float top_r = *std::max_element(r, r + V), top_c = *std::max_element(c, c + V);
      int64_t ar = std::max_element(r, r + V) - r;
      switch (i % 16) {
        case 0: r[3] = r[V - 1] = top_r + 1.0f, c[3] = c[V - 1] = top_c + 1.0f; break;  // ties far apart: agree
        case 1: r[3] = r[V - 1] = top_r + 1.0f, c[V - 1] = top_c + 1.0f; break;         // argmax 3 vs V-1
        case 2: c[V / 2] = kNaN; break;
        case 3: c[V - 1] = kInf; break;
        case 4: c[1] = -kInf; break;                              // p_ref > 0 there: KL = +inf
        case 5: r[2] = c[2] = -kInf; break;                       // p_ref = 0 there: finite
        case 6: r[0] = kNaN; break;
        case 7: r[V - 2] = kInf; break;
        case 8: r[0] = r[V - 1] = -kInf; break;
        case 9: std::fill(r, r + V, -kInf); break;                // no reference distribution
        case 10: std::fill(c, c + V, -kInf); break;               // no configuration distribution
        case 11: c[ar] = -kInf; break;                            // -inf at the reference's top token
        case 12: c[ar] = top_c - 800.0f; break;                   // the anchor moves to cfg's max
        case 13: targets[static_cast<std::size_t>(i)] = -1; break;
        case 14: r[1] = -1e30f, c[1] = top_c + 3.0f; break;       // cfg's mass where p_ref = 0
        default: c[0] = kNaN, c[1] = -kInf, c[2] = kInf; break;   // three non-finite values
      }
    }
    const auto cpu = cpu_results(ref, cfg, targets);
    const auto gpu = gpu_results(ref, cfg, targets, 0);
    check_equal(gpu, cpu, ref, cfg, targets, 1e-13, "special rows, vocab " + std::to_string(V));
    CAPTURE(V);
    const auto& g = gpu;
    CHECK(g[0].top1_agree);
    CHECK_FALSE(g[1].top1_agree);
    CHECK((std::isnan(g[2].kl) && !g[2].finite && g[2].nonfinite_values == 1));
    CHECK((std::isnan(g[3].kl) && !g[3].finite));
    CHECK((g[4].kl == std::numeric_limits<double>::infinity() && !g[4].finite && g[4].ref_finite));
    CHECK((g[5].finite && g[5].nonfinite_values == 1));
    CHECK((!g[6].ref_finite && !g[6].finite));
    CHECK(!g[7].ref_finite);
    CHECK(g[8].ref_finite);
    CHECK(!g[9].ref_finite);
    CHECK((g[10].ref_finite && std::isnan(g[10].kl) && g[10].nonfinite_values == V));
    CHECK(g[11].kl == std::numeric_limits<double>::infinity());
    CHECK((g[12].finite && g[12].kl > 0.1));
    CHECK(!g[13].has_target);
    CHECK(g[14].finite);
    CHECK(g[15].nonfinite_values == 3);
  }
}

TEST_CASE("bad shapes and targets are refused, naming both shapes or the row") {
  HostRows a(3, 7, 7), b(3, 8, 8);
  for (auto& x : a.v) x = 0.0f;
  for (auto& x : b.v) x = 0.0f;
  const DeviceRows da(a, 0), db(b, 0);
  cuda::DeviceBuffer<int32_t> t;
  t.upload(std::vector<int32_t>{0, 7, -1});
  std::vector<PositionResult> out(3);
  const std::string shape = test::error_of<std::invalid_argument>([&] { cuda::compare_positions_gpu(da.view, db.view, t.data(), out, nullptr); });
  CHECK(test::contains(shape, "3x7"));
  CHECK(test::contains(shape, "3x8"));
  const std::string target = test::error_of<std::invalid_argument>([&] { cuda::compare_positions_gpu(da.view, da.view, t.data(), out, nullptr); });
  CHECK(test::contains(target, "target token 7 of row 1"));
  std::vector<PositionResult> short_out(2);
  CHECK_THROWS_AS(cuda::compare_positions_gpu(da.view, da.view, t.data(), short_out, nullptr), std::invalid_argument);
  const cuda::ConstDeviceMatrix narrow(da.view.data, 3, 7, 6);
  CHECK_THROWS_AS(cuda::compare_positions_gpu(narrow, narrow, t.data(), out, nullptr), std::invalid_argument);
}

TEST_CASE("throughput at 1024 rows x 248320 beside a device-to-device copy (printed, not asserted)") {
  const int64_t rows = 1024, V = 248320;
  const std::size_t n = static_cast<std::size_t>(rows * V), bytes = n * sizeof(float);
  std::vector<float> h(n);
  for (std::size_t k = 0; k < n; ++k) h[k] = static_cast<float>(3.0 * gauss(test::kBaseSeed + 400, k));
  cuda::DeviceBuffer<float> ref(n), close(n), far(n), copy(n);
  ref.upload(h);
  for (std::size_t k = 0; k < n; ++k) h[k] += static_cast<float>(1e-3 * gauss(test::kBaseSeed + 401, k));
  close.upload(h);
  for (std::size_t k = 0; k < n; ++k) h[k] = static_cast<float>(3.0 * gauss(test::kBaseSeed + 402, k));
  far.upload(h);
  std::vector<int32_t> targets(static_cast<std::size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) targets[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7919) % V);
  cuda::DeviceBuffer<int32_t> t;
  t.upload(targets);
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());

  cudaEvent_t e0, e1;
  REPLAYSSM_CUDA_CHECK(cudaEventCreate(&e0));
  REPLAYSSM_CUDA_CHECK(cudaEventCreate(&e1));
  const int reps = 5;
  REPLAYSSM_CUDA_CHECK(cudaMemcpy(copy.data(), ref.data(), bytes, cudaMemcpyDeviceToDevice));
  REPLAYSSM_CUDA_CHECK(cudaEventRecord(e0));
  for (int k = 0; k < reps; ++k) REPLAYSSM_CUDA_CHECK(cudaMemcpy(copy.data(), ref.data(), bytes, cudaMemcpyDeviceToDevice));
  REPLAYSSM_CUDA_CHECK(cudaEventRecord(e1));
  REPLAYSSM_CUDA_CHECK(cudaEventSynchronize(e1));
  float copy_ms = 0.0f;
  REPLAYSSM_CUDA_CHECK(cudaEventElapsedTime(&copy_ms, e0, e1));
  const double copy_gbs = 2.0 * static_cast<double>(bytes) * reps / (copy_ms * 1e-3) / 1e9;  // read + write
  std::printf("cudaMemcpy device-to-device, %.2f GB: %.1f GB/s (read + write)\n", bytes / 1e9, copy_gbs);

  std::vector<PositionResult> out(static_cast<std::size_t>(rows));
  const cuda::ConstDeviceMatrix r(ref.data(), rows, V, V);
  for (const auto& [name, buf] : {std::pair<const char*, const float*>{"close rows (1e-3 noise)", close.data()},
                                  std::pair<const char*, const float*>{"independent rows", far.data()}}) {
    const cuda::ConstDeviceMatrix c(buf, rows, V, V);
    cuda::compare_positions_gpu(r, c, t.data(), out, nullptr);  // warm-up
    std::vector<double> times;
    for (int k = 0; k < reps; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      cuda::compare_positions_gpu(r, c, t.data(), out, nullptr);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    const double s = times[times.size() / 2], logits = 2.0 * static_cast<double>(bytes);
    std::printf("compare_positions_gpu, %s: %.2f ms per call (median of %d); %.1f GB/s of logits compared "
                "(%.0f%% of the copy's read+write rate; each row is read twice: %.1f GB/s moved)\n",
                name, s * 1e3, reps, logits / s / 1e9, 100.0 * logits / s / 1e9 / copy_gbs, 2.0 * logits / s / 1e9);
    CHECK(std::isfinite(out[1].kl));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}
