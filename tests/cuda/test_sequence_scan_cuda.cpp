// The CUDA layer scan (cuda/ssm/sequence_scan.h) against its CPU twin ssm::emulate_layer_sequence
// on fresh random inputs: outputs and every quantization event's checkpoints must be BIT-IDENTICAL
// (the only latitude: a NaN equals any NaN, since IEEE leaves NaN payloads to the hardware and x86
// and CUDA produce different ones). Every policy kind x state format x RTN/SR x recurrence, head
// shapes dk 48/64/128/256, dv 16/24/80/128/256, GQA ratios 1..16, N not a multiple of L, N = 1,
// strided inputs, an FP16 overflow, 64-bit offsets at N = 131072; the split of a head's rows over
// several blocks (rows per warp and blocks per head depend on the layer's size, see
// sequence_scan.cu): dv not a multiple of the rows per warp or per block, NVFP4's cluster-wide
// tensor amax over 2..8 blocks, many heads; error feedback (+ef) and appendix F skipping
// (,skip=) with their skip counts. Prints (does not assert) the kernel time of one
// Qwen3.5-4B-shaped GDN layer and one tiny_mamba2-shaped layer at N = 131072. Skips (exit 77)
// without a GPU.
#include <doctest/doctest.h>

#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "device_memory.h"
#include "ssm/sequence_scan.h"
#include "test_util.h"
#include "gpu_test_util.h"

using namespace replayssm;
using ssm::LayerSequence;
using ssm::PrecisionPolicy;
using ssm::Recurrence;

namespace {

const test::GpuGuard gpu_guard("scan kernel tests");

constexpr float kPadding = -12345.0f;  // between rows of strided operands: never read as data, never written

struct Shape {
  int dk, dv, key_heads, group;  // group = value heads per key head (GQA ratio)
  int heads() const { return key_heads * group; }
};

// A layer's inputs on the host, strided (ld = width + pad), in LayerSequence layout.
struct HostLayer {
  Recurrence kind;
  Shape shape;
  int n = 0;
  int64_t ld_q, ld_k, ld_alpha, ld_beta, ld_v, ld_out;
  std::vector<float> q, k, alpha, beta, v;
};

// Realistic inputs: decays near 1 (slow) or far from it; beta in (0.05, 0.95); gdn/kda q, k
// L2-normalised (q also scaled by 1/sqrt(dk), Qwen3.5), mamba2 q, k ~ N(0, 1/dk); v ~ N(0, v_scale^2).
HostLayer make_layer(Recurrence kind, Shape s, int n, bool slow_decay, uint64_t seed, int64_t pad = 3,
                     float v_scale = 1.0f, float decay_override = 0.0f) {
  boost::random::mt19937_64 rng(seed);
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  boost::random::uniform_real_distribution<float> unit(0.0f, 1.0f);
  HostLayer L;
  L.kind = kind, L.shape = s, L.n = n;
  const int H = s.heads(), w = ssm::decay_width(kind, s.dk);
  const bool delta = ssm::has_delta_rule(kind);
  L.ld_q = s.key_heads * s.dk + pad, L.ld_k = s.key_heads * s.dk + 2 * pad, L.ld_alpha = H * w + pad;
  L.ld_beta = H + pad, L.ld_v = H * s.dv + pad, L.ld_out = H * s.dv + 2 * pad;
  const std::size_t N = static_cast<std::size_t>(n);
  L.q.assign(N * L.ld_q, kPadding), L.k.assign(N * L.ld_k, kPadding), L.alpha.assign(N * L.ld_alpha, kPadding);
  L.v.assign(N * L.ld_v, kPadding);
  if (delta) L.beta.assign(N * L.ld_beta, kPadding);
  std::vector<double> qq(s.dk), kk(s.dk);
  for (std::size_t t = 0; t < N; ++t) {
    for (int g = 0; g < s.key_heads; ++g) {
      double nq = 0, nk = 0;
      for (int c = 0; c < s.dk; ++c) qq[c] = normal(rng), kk[c] = normal(rng), nq += qq[c] * qq[c], nk += kk[c] * kk[c];
      const double sq = delta ? 1.0 / (std::sqrt(nq) * std::sqrt(double(s.dk))) : 1.0 / std::sqrt(double(s.dk));
      const double sk = delta ? 1.0 / std::sqrt(nk) : 1.0 / std::sqrt(double(s.dk));
      for (int c = 0; c < s.dk; ++c) {
        L.q[t * L.ld_q + g * s.dk + c] = static_cast<float>(qq[c] * sq);
        L.k[t * L.ld_k + g * s.dk + c] = static_cast<float>(kk[c] * sk);
      }
    }
    for (int h = 0; h < H; ++h) {
      for (int c = 0; c < w; ++c)
        L.alpha[t * L.ld_alpha + h * w + c] =
            decay_override > 0 ? decay_override : slow_decay ? 0.995f + 0.005f * unit(rng) : 0.3f + 0.5f * unit(rng);
      if (delta) L.beta[t * L.ld_beta + h] = 0.05f + 0.9f * unit(rng);
      for (int r = 0; r < s.dv; ++r) L.v[t * L.ld_v + h * s.dv + r] = v_scale * normal(rng);
    }
  }
  return L;
}

LayerSequence host_view(HostLayer& L, std::vector<float>& out) {
  LayerSequence s;
  s.kind = L.kind, s.n_tokens = L.n, s.dk = L.shape.dk, s.dv = L.shape.dv;
  s.n_key_heads = L.shape.key_heads, s.n_value_heads = L.shape.heads();
  s.q = L.q.data(), s.k = L.k.data(), s.alpha = L.alpha.data(), s.v = L.v.data(), s.out = out.data();
  s.beta = ssm::has_delta_rule(L.kind) ? L.beta.data() : nullptr;
  s.ld_q = L.ld_q, s.ld_k = L.ld_k, s.ld_alpha = L.ld_alpha, s.ld_beta = L.ld_beta, s.ld_v = L.ld_v;
  s.ld_out = L.ld_out;
  return s;
}

// Bit equality, except that any NaN equals any NaN (payloads are the hardware's).
bool same_value(float a, float b) {
  if (std::isnan(a) && std::isnan(b)) return true;
  return std::memcmp(&a, &b, sizeof a) == 0;
}

struct Diff {
  std::size_t differing = 0, first = 0;
  float got = 0, want = 0;
  std::string report(const std::string& what, std::size_t n) const {
    std::ostringstream s;
    s.precision(9);
    s << what << ": " << differing << " of " << n << " elements differ";
    if (differing) {
      uint32_t gb, wb;
      std::memcpy(&gb, &got, 4), std::memcpy(&wb, &want, 4);
      s << "; first at [" << first << "]: gpu " << got << " (0x" << std::hex << gb << "), cpu " << std::dec << want
        << " (0x" << std::hex << wb << ")";
    }
    return s.str();
  }
};

// Compares element i of got/want for i in `indices` order (flat positions given by index(i)).
template <class Index>
Diff compare(const std::vector<float>& got, const std::vector<float>& want, std::size_t n, Index index) {
  Diff d;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t at = index(i);
    if (!same_value(got[at], want[at])) {
      if (d.differing++ == 0) d.first = at, d.got = got[at], d.want = want[at];
    }
  }
  return d;
}

struct RunResult {
  std::vector<float> out, ck_recur, ck_read;
  std::vector<int64_t> skips;  // skip policies: per value head steps, steps_skipped, flushes, flushes_skipped
};

// The CPU twin with checkpoints gathered into the ScanCheckpoints layout.
RunResult run_cpu(HostLayer& L, const PrecisionPolicy& p, uint32_t layer) {
  RunResult r;
  r.out.assign(static_cast<std::size_t>(L.n) * L.ld_out, kPadding);
  const int64_t E = static_cast<int64_t>(ssm::quantization_events(p, L.n));
  const std::size_t hd = static_cast<std::size_t>(L.shape.dv) * L.shape.dk;
  const bool split = p.scheme == ssm::DecodeScheme::split;
  r.ck_recur.assign(static_cast<std::size_t>(L.shape.heads() * E) * hd, 0.0f);
  if (split) r.ck_read.assign(r.ck_recur.size(), 0.0f);
  std::vector<int64_t> count(static_cast<std::size_t>(L.shape.heads()), 0);
  ssm::EmulatorOptions opt;
  opt.on_checkpoint = [&](int h, int64_t token, const float* recur, const float* read) {
    const int64_t e = count[static_cast<std::size_t>(h)]++;
    REQUIRE(e < E);
    REQUIRE(token == (p.scheme == ssm::DecodeScheme::conventional ? e : (e + 1) * p.window - 1));
    std::memcpy(&r.ck_recur[static_cast<std::size_t>(h * E + e) * hd], recur, hd * sizeof(float));
    if (split) std::memcpy(&r.ck_read[static_cast<std::size_t>(h * E + e) * hd], read, hd * sizeof(float));
  };
  if (p.skip.mode != ssm::CheckpointSkip::Mode::off) {
    r.skips.assign(4 * static_cast<std::size_t>(L.shape.heads()), -1);
    opt.on_skip_counts = [&](int h, const ssm::SkipCounts& c) {
      int64_t* d = &r.skips[4 * static_cast<std::size_t>(h)];
      d[0] = c.steps, d[1] = c.steps_skipped, d[2] = c.flushes, d[3] = c.flushes_skipped;
    };
  }
  LayerSequence s = host_view(L, r.out);
  ssm::emulate_layer_sequence(s, p, layer, opt);
  for (int64_t c : count) REQUIRE(c == E);
  return r;
}

struct DeviceLayer {
  cuda::DeviceBuffer<float> q, k, alpha, beta, v, out;
  explicit DeviceLayer(const HostLayer& L) {
    q.upload(L.q), k.upload(L.k), alpha.upload(L.alpha), v.upload(L.v);
    if (!L.beta.empty()) beta.upload(L.beta);
    const std::vector<float> o(static_cast<std::size_t>(L.n) * L.ld_out, kPadding);
    out.upload(o);
  }
  LayerSequence view(const HostLayer& L) {
    LayerSequence s;
    s.kind = L.kind, s.n_tokens = L.n, s.dk = L.shape.dk, s.dv = L.shape.dv;
    s.n_key_heads = L.shape.key_heads, s.n_value_heads = L.shape.heads();
    s.q = q.data(), s.k = k.data(), s.alpha = alpha.data(), s.v = v.data(), s.out = out.data();
    s.beta = ssm::has_delta_rule(L.kind) ? beta.data() : nullptr;
    s.ld_q = L.ld_q, s.ld_k = L.ld_k, s.ld_alpha = L.ld_alpha, s.ld_beta = L.ld_beta, s.ld_v = L.ld_v;
    s.ld_out = L.ld_out;
    return s;
  }
};

RunResult run_gpu(HostLayer& L, const PrecisionPolicy& p, uint32_t layer) {
  DeviceLayer d(L);
  const int64_t E = static_cast<int64_t>(ssm::quantization_events(p, L.n));
  const std::size_t n_ck = static_cast<std::size_t>(L.shape.heads() * E) * L.shape.dv * L.shape.dk;
  const bool split = p.scheme == ssm::DecodeScheme::split;
  const bool skips = p.skip.mode != ssm::CheckpointSkip::Mode::off;
  cuda::DeviceBuffer<float> ck_recur(n_ck), ck_read(split ? n_ck : 0);
  cuda::DeviceBuffer<int64_t> skip_counts;
  if (skips) skip_counts.upload(std::vector<int64_t>(4 * static_cast<std::size_t>(L.shape.heads()), -1));
  cuda::ScanCheckpoints ck{ck_recur.data(), split ? ck_read.data() : nullptr, E, skips ? skip_counts.data() : nullptr};
  cuda::emulate_layer_sequence_gpu(d.view(L), p, layer, nullptr, &ck);
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  RunResult r;
  r.out = d.out.to_host();
  r.ck_recur = ck_recur.to_host();
  if (split) r.ck_read = ck_read.to_host();
  if (skips) r.skips = skip_counts.to_host();
  return r;
}

struct CaseResult {
  Diff out, padding, recur, read;
  bool nonfinite_cpu = false;
  int64_t reads_skipped = 0, reads = 0;  // skip policies: over all heads, non-flush steps and flushes (CPU)
};

// GPU vs CPU on one case; every difference is reported (counts and the first one).
CaseResult check_case(HostLayer& L, const PrecisionPolicy& p, uint32_t layer, const std::string& label) {
  const RunResult cpu = run_cpu(L, p, layer), gpu = run_gpu(L, p, layer);
  const int H = L.shape.heads(), dv = L.shape.dv;
  CaseResult c;
  const std::size_t n_out = static_cast<std::size_t>(L.n) * H * dv;
  const int64_t row = static_cast<int64_t>(H) * dv;
  c.out = compare(gpu.out, cpu.out, n_out, [&](std::size_t i) { return (i / row) * L.ld_out + i % row; });
  const int64_t pad = L.ld_out - row;
  c.padding = compare(gpu.out, cpu.out, static_cast<std::size_t>(L.n) * pad,
                      [&](std::size_t i) { return (i / pad) * L.ld_out + row + i % pad; });
  c.recur = compare(gpu.ck_recur, cpu.ck_recur, cpu.ck_recur.size(), [](std::size_t i) { return i; });
  c.read = compare(gpu.ck_read, cpu.ck_read, cpu.ck_read.size(), [](std::size_t i) { return i; });
  for (std::size_t i = 0; i < n_out && !c.nonfinite_cpu; ++i)
    c.nonfinite_cpu = !std::isfinite(cpu.out[(i / row) * L.ld_out + i % row]);
  INFO(label);
  CHECK_MESSAGE(c.out.differing == 0, c.out.report("outputs", n_out));
  CHECK_MESSAGE(c.padding.differing == 0, c.padding.report("output padding (must stay untouched)", L.n * pad));
  CHECK_MESSAGE(c.recur.differing == 0, c.recur.report("recur checkpoints", cpu.ck_recur.size()));
  CHECK_MESSAGE(c.read.differing == 0, c.read.report("read checkpoints", cpu.ck_read.size()));
  CHECK_MESSAGE(gpu.skips == cpu.skips, "skip counts (steps, skipped, flushes, skipped) per head differ");
  for (std::size_t h = 0; h < cpu.skips.size(); h += 4) {
    c.reads += cpu.skips[h] + cpu.skips[h + 2];
    c.reads_skipped += cpu.skips[h + 1] + cpu.skips[h + 3];
  }
  return c;
}

std::string label_of(Recurrence kind, const Shape& s, int n, const std::string& policy) {
  std::ostringstream l;
  l << to_string(kind) << " " << policy << " dk=" << s.dk << " dv=" << s.dv << " key_heads=" << s.key_heads
    << " G=" << s.group << " N=" << n;
  return l.str();
}

}  // namespace

TEST_CASE("scan == emulate_layer_sequence bit for bit: every policy kind, format, rounding, recurrence, shape") {
  // Formats the policies accept (fp8b128 needs dk % 128 == 0, nvfp4 dk % 16, e2m1 dk % 2).
  const char* policies[] = {
      "conv:fp32",           "conv:fp16+rtn",         "conv:fp16+sr,seed=3",         "conv:bf16+sr,seed=4",
      "conv:e4m3+rtn",       "conv:e2m1+sr,seed=5",   "conv:fp8b128+sr,seed=6",      "conv:nvfp4+rtn",
      "conv:nvfp4+sr,seed=7", "shared:fp32@16",       "shared:fp16+sr@16,seed=8",    "shared:bf16+rtn@3",
      "shared:e4m3+sr@4,seed=9", "shared:fp8b128+rtn@8", "shared:fp8b128+sr@16,seed=10", "shared:nvfp4+rtn@5",
      "shared:nvfp4+sr@16,seed=11", "shared:nvfp4+sr@1,seed=12", "split:nvfp4/fp32@16", "split:nvfp4/fp16+sr@16,seed=13",
      "split:nvfp4/fp8b128+sr@8,seed=14", "split:fp8b128+rtn/bf16+sr@5,seed=15", "split:e4m3/nvfp4+sr@6,seed=16",
      "split:nvfp4+sr/nvfp4+sr@4,seed=17", "split:fp16/fp32@7"};
  const Shape shapes[] = {{64, 16, 2, 1},  {128, 24, 1, 3}, {128, 80, 2, 2}, {256, 128, 1, 2}, {64, 128, 1, 16},
                          {128, 128, 2, 4}, {48, 24, 1, 2},  {256, 16, 2, 2}, {256, 256, 1, 1}, {128, 256, 1, 2}};
  uint64_t seed = test::kBaseSeed * 1000 + 2000;
  int case_index = 0, cases = 0;
  const auto start = std::chrono::steady_clock::now();
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    for (const char* text : policies) {
      const PrecisionPolicy p = PrecisionPolicy::parse(text);
      const bool fp8 = p.recur.format == formats::StorageFormat::fp8b128 ||
                       (p.scheme == ssm::DecodeScheme::split && p.read.format == formats::StorageFormat::fp8b128);
      // The next shape this policy's formats accept (cycling, so every shape meets many policies).
      Shape s{};
      for (;;) {
        s = shapes[case_index++ % std::size(shapes)];
        if (!fp8 || s.dk % 128 == 0) break;
      }
      const bool conv = p.scheme == ssm::DecodeScheme::conventional;
      // Conventional policies checkpoint every token: fewer tokens. N is never a multiple of L.
      const int n = (conv ? 60 : 200) + 16 * (case_index % 5) + 7;
      const bool slow = case_index % 2 == 0;
      HostLayer L = make_layer(kind, s, n, slow, ++seed, 1 + case_index % 4);
      check_case(L, p, static_cast<uint32_t>(case_index % 40), label_of(kind, s, n, text) + (slow ? " slow" : " fast"));
      ++cases;
    }
  }
  std::printf("[scan vs CPU] %d cases in %.1f s\n", cases,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Error feedback (+ef) and appendix F skipping (,skip=) against the CPU emulator: the residual
// carried between a copy's events, the NVFP4 tensor amax over value + residual (one copy ef, the
// other not, shares no amax), skipped reads and pure-write flushes. Fast decays make some reads
// skip (asserted: a skip case that skips nothing, or everything, tests nothing); slow ones none.
TEST_CASE("scan == emulate_layer_sequence bit for bit: error feedback and checkpoint-read skipping") {
  const char* ef_policies[] = {"conv:fp16+ef",          "conv:nvfp4+ef",           "conv:fp8b128+ef",
                               "shared:nvfp4+ef@16",    "shared:bf16+ef@5",        "shared:fp8b128+ef@8",
                               "split:nvfp4+ef/fp32@16", "split:nvfp4/fp16+ef@8",  "split:nvfp4+ef/nvfp4+ef@4",
                               "split:nvfp4+ef/nvfp4@6", "split:e4m3+ef/bf16+sr@5,seed=3", "split:fp16+ef/fp32@7"};
  const char* skip_policies[] = {"shared:nvfp4@16,skip=auto",          "split:nvfp4/fp32@16,skip=auto",
                                 "split:nvfp4/fp16+sr@8,seed=2,skip=0.05", "shared:fp16+sr@4,seed=4,skip=0.3",
                                 "split:fp8b128/bf16@5,skip=auto",     "shared:nvfp4+ef@8,skip=0.1",
                                 "split:nvfp4+ef/fp16+ef@16,skip=auto", "split:nvfp4+sr/nvfp4+sr@4,seed=6,skip=0.2"};
  const Shape shapes[] = {{128, 24, 1, 3}, {64, 16, 2, 1}, {128, 80, 2, 2}, {256, 128, 1, 2},
                          {128, 128, 2, 4}, {128, 200, 1, 2}, {256, 256, 1, 1}, {128, 18, 8, 20}};
  uint64_t seed = test::kBaseSeed * 1000 + 9000;
  int index = 0, shape_index = 0;
  // The next shape (cycling) whose dk the policy's formats accept (fp8b128: a multiple of 128).
  auto next_shape = [&](const PrecisionPolicy& p) {
    const bool fp8 = p.recur.format == formats::StorageFormat::fp8b128 ||
                     (p.scheme == ssm::DecodeScheme::split && p.read.format == formats::StorageFormat::fp8b128);
    for (;;) {
      const Shape s = shapes[shape_index++ % std::size(shapes)];
      if (!fp8 || s.dk % 128 == 0) return s;
    }
  };
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    for (const char* text : ef_policies) {
      const PrecisionPolicy p = PrecisionPolicy::parse(text);
      const Shape s = next_shape(p);
      const int n = (p.scheme == ssm::DecodeScheme::conventional ? 50 : 150) + 16 * (index % 3) + 5;
      HostLayer L = make_layer(kind, s, n, index % 2 == 0, ++seed, 1 + index % 3);
      check_case(L, p, static_cast<uint32_t>(index % 30), label_of(kind, s, n, text));
      ++index;
    }
    int64_t reads = 0, skipped = 0;
    // KDA skips by its largest channel's decay (the slowest channel must be resolvable too), so random
    // per-channel decays in (0.3, 0.8) rarely skip within a window of 4-16 (the largest of 128 channels'
    // products stays near 0.8^h; measured on the H200: one such case skipped nothing). KDA therefore
    // also runs every policy on layers whose channels all decay at 0.35, where the skip assertions apply.
    enum class Decays { fast, slow, fast_uniform };
    std::vector<Decays> variants = {Decays::fast, Decays::slow};
    if (kind == Recurrence::kda) variants.push_back(Decays::fast_uniform);
    for (const char* text : skip_policies) {
      const PrecisionPolicy p = PrecisionPolicy::parse(text);
      const std::string name(text);
      for (Decays decays : variants) {
        const Shape s = next_shape(p);
        const int n = 150 + 16 * (index % 3) + 5;
        const bool slow = decays == Decays::slow;
        HostLayer L = make_layer(kind, s, n, slow, ++seed, 1 + index % 3, 1.0f, decays == Decays::fast_uniform ? 0.35f : 0.0f);
        const char* tag = slow ? " slow" : decays == Decays::fast ? " fast" : " fast uniform";
        const CaseResult c = check_case(L, p, static_cast<uint32_t>(index % 30), label_of(kind, s, n, text) + tag);
        if (slow) CHECK_MESSAGE(c.reads_skipped == 0, name << ": slow decays (>= 0.995) skipped a read");
        const bool assert_skips = decays == Decays::fast_uniform || (decays == Decays::fast && kind != Recurrence::kda);
        if (assert_skips) {
          CHECK_MESSAGE(c.reads_skipped > 0, name << tag << ": fast decays skipped no read: the case tests nothing");
          CHECK_MESSAGE(c.reads_skipped < c.reads, name << tag << ": every read skipped, the checkpoint path untested");
        }
        reads += c.reads, skipped += c.reads_skipped;
        ++index;
      }
    }
    std::printf("[scan vs CPU, skip] %s: %lld of %lld reads skipped\n", std::string(to_string(kind)).c_str(),
                static_cast<long long>(skipped), static_cast<long long>(reads));
  }
}

TEST_CASE("scan: N = 1, N < L, GQA ratios 1..16") {
  uint64_t seed = test::kBaseSeed * 1000 + 3000;
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    for (const char* text : {"conv:nvfp4+sr,seed=1", "shared:nvfp4+sr@16,seed=2", "split:nvfp4/fp16+sr@16,seed=3"}) {
      const PrecisionPolicy p = PrecisionPolicy::parse(text);
      for (int n : {1, 15, 16, 17}) {
        const Shape s{64, 16, 1, 1};
        HostLayer L = make_layer(kind, s, n, false, ++seed);
        check_case(L, p, 1, label_of(kind, s, n, text));
      }
      for (int G : {1, 2, 3, 4, 5, 8, 16}) {
        const Shape s{128, 24, 16 / G > 2 ? 2 : 1, G};
        HostLayer L = make_layer(kind, s, 40, true, ++seed);
        check_case(L, p, 2, label_of(kind, s, 40, text));
      }
    }
  }
}

// Geometry on an H200 (132 multiprocessors; sequence_scan.cu geometry_for): rows per warp RB = 4
// when the layer has >= 6 x 132 warps of 4 rows, else 2, else 1; blocks of up to 8 warps; NVFP4
// raises RB until a head fits one cluster of <= 8 blocks. The shapes below are picked to land on
// each branch there (any other GPU still runs them, bit identity does not depend on the geometry).
TEST_CASE("scan: a head's rows split over blocks (ragged warps and blocks, NVFP4 cluster amax, many heads)") {
  struct Case {
    Recurrence kind;
    Shape shape;
    int n;
    const char* policy;
    const char* why;
  };
  const Case cases[] = {
      // Few heads, RB = 1: 8 rows a block; dv 20 leaves a last block of 4 rows.
      {Recurrence::gdn, {64, 20, 1, 2}, 90, "shared:fp16+sr@8,seed=31", "RB 1, dv 20: 3 blocks, last one half padding"},
      {Recurrence::kda, {128, 24, 2, 1}, 90, "split:fp8b128+rtn/bf16+sr@5,seed=32", "RB 1, dv 24: 3 blocks"},
      {Recurrence::mamba2, {128, 80, 1, 3}, 70, "conv:e4m3+sr,seed=33", "RB 1, dv 80: 10 blocks a head"},
      {Recurrence::gdn, {128, 200, 1, 1}, 70, "shared:fp8b128+sr@4,seed=34", "RB 1, dv 200: 25 blocks a head"},
      // NVFP4: one cluster a head. dv 24 -> 3 blocks; 64 (tiny_mamba2) -> 8 blocks of RB 1; 80 -> RB 2,
      // 5 blocks; 128 -> RB 2, 8 blocks; 200 -> RB 4, 7 blocks, the last with 6 padding warps; 256 -> RB 4, 8.
      {Recurrence::gdn, {64, 24, 1, 2}, 100, "shared:nvfp4+sr@4,seed=35", "NVFP4 cluster of 3"},
      {Recurrence::mamba2, {128, 64, 2, 4}, 100, "shared:nvfp4+sr@16,seed=36", "tiny_mamba2 shape: cluster of 8"},
      {Recurrence::kda, {64, 80, 1, 2}, 60, "conv:nvfp4+sr,seed=37", "NVFP4 RB 2, cluster of 5"},
      {Recurrence::gdn, {128, 128, 2, 2}, 100, "split:nvfp4/fp32@8", "NVFP4 RB 2, cluster of 8, split"},
      {Recurrence::gdn, {128, 128, 1, 3}, 100, "split:nvfp4+sr/nvfp4+sr@6,seed=38", "both copies NVFP4"},
      {Recurrence::mamba2, {256, 200, 1, 2}, 80, "shared:nvfp4+rtn@5", "NVFP4 RB 4, cluster of 7"},
      {Recurrence::kda, {128, 200, 2, 1}, 60, "split:e4m3/nvfp4+sr@6,seed=39", "NVFP4 read copy only, cluster of 7"},
      {Recurrence::gdn, {256, 256, 1, 2}, 60, "conv:nvfp4+sr,seed=40", "NVFP4 RB 4, cluster of 8, every token"},
      // Many heads, RB = 4: dv 18 leaves the last warp of a head with 2 padding rows.
      {Recurrence::gdn, {64, 18, 8, 20}, 50, "shared:nvfp4+sr@4,seed=41", "160 heads, RB 4, dv 18 (ragged warp)"},
      {Recurrence::mamba2, {128, 18, 8, 20}, 50, "split:fp8b128/fp16+sr@4,seed=42", "160 heads, RB 4, fp8b128"},
      {Recurrence::kda, {64, 18, 8, 20}, 40, "conv:bf16+sr,seed=43", "160 heads, RB 4, kda"},
      // The Qwen3.5-4B GDN shape at few tokens: 32 heads x 32 warps of RB 4, 4 blocks a head.
      {Recurrence::gdn, {128, 128, 16, 2}, 40, "shared:nvfp4+sr@16,seed=44", "Qwen3.5-4B GDN shape, NVFP4"},
      {Recurrence::gdn, {128, 128, 16, 2}, 40, "split:nvfp4/fp32@16", "Qwen3.5-4B GDN shape, split"},
      {Recurrence::gdn, {128, 128, 16, 2}, 40, "conv:fp8b128+sr,seed=45", "Qwen3.5-4B GDN shape, fp8b128"},
      {Recurrence::mamba2, {128, 80, 8, 12}, 30, "shared:nvfp4+sr@8,seed=46", "Nemotron-H Mamba-2 shape (96 heads of 80)"},
  };
  uint64_t seed = test::kBaseSeed * 1000 + 8000;
  int index = 0;
  for (const Case& c : cases) {
    const PrecisionPolicy p = PrecisionPolicy::parse(c.policy);
    HostLayer L = make_layer(c.kind, c.shape, c.n, index % 2 == 0, ++seed, 1 + index % 3);
    check_case(L, p, static_cast<uint32_t>(10 + index), label_of(c.kind, c.shape, c.n, c.policy) + " (" + c.why + ")");
    ++index;
  }
}

TEST_CASE("scan: an FP16 state that overflows gives the same inf/NaN as the CPU") {
  uint64_t seed = test::kBaseSeed * 1000 + 4000;
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn}) {
    for (const char* text : {"conv:fp16+rtn", "shared:fp16+sr@4,seed=2", "split:nvfp4/fp16+sr@4,seed=3"}) {
      const PrecisionPolicy p = PrecisionPolicy::parse(text);
      const Shape s{64, 16, 1, 2};
      // No decay and huge values: state entries pass FP16's 65504 (inf), then inf - inf gives NaN.
      HostLayer L = make_layer(kind, s, 120, true, ++seed, 2, 1e6f, 1.0f);
      const CaseResult c = check_case(L, p, 0, label_of(kind, s, 120, text) + " overflow");
      CHECK_MESSAGE(c.nonfinite_cpu, "the overflow case produced no inf/NaN: it tests nothing");
    }
  }
}

TEST_CASE("scan: 64-bit offsets at N = 131072 (an operand's element offsets pass 2^31)") {
  const Shape s{64, 16, 1, 1};
  const int n = 131072;
  // ld_v = 16400: token 131071's values start at element 2.15e9 > 2^31.
  HostLayer L = make_layer(Recurrence::gdn, s, n, true, test::kBaseSeed * 1000 + 5000, 3);
  {
    const int64_t ld_v = 16400;
    std::vector<float> v(static_cast<std::size_t>(n) * ld_v, kPadding);
    for (std::size_t t = 0; t < static_cast<std::size_t>(n); ++t)
      std::memcpy(&v[t * ld_v], &L.v[t * L.ld_v], sizeof(float) * s.dv);
    L.v = std::move(v);
    L.ld_v = ld_v;
  }
  check_case(L, PrecisionPolicy::parse("shared:nvfp4+sr@16,seed=21"), 3, "gdn shared:nvfp4+sr@16 N=131072 ld_v=16400");
}

TEST_CASE("scan: argument checks as the CPU twin, and the GPU's own limits") {
  HostLayer L = make_layer(Recurrence::gdn, {64, 16, 1, 2}, 8, true, test::kBaseSeed + 6000);
  DeviceLayer d(L);
  const PrecisionPolicy p = PrecisionPolicy::parse("shared:nvfp4@4");
  auto gpu_error = [&](auto mutate, const PrecisionPolicy& policy, cuda::ScanCheckpoints* ck = nullptr) {
    LayerSequence s = d.view(L);
    mutate(s);
    return test::error_of<std::invalid_argument>([&] { cuda::emulate_layer_sequence_gpu(s, policy, 0, nullptr, ck); });
  };
  auto cpu_error = [&](auto mutate, const PrecisionPolicy& policy) {
    std::vector<float> out(static_cast<std::size_t>(L.n) * L.ld_out);
    LayerSequence s = host_view(L, out);
    mutate(s);
    return test::error_of<std::invalid_argument>([&] { ssm::emulate_layer_sequence(s, policy, 0); });
  };
  auto both = [&](auto mutate, const PrecisionPolicy& policy) {
    const std::string g = gpu_error(mutate, policy), c = cpu_error(mutate, policy);
    CHECK(g != "(no error)");
    CHECK(g == c);
  };
  both([](LayerSequence& s) { s.ld_v = 31; }, p);
  both([](LayerSequence& s) { s.n_value_heads = 3; }, p);
  both([](LayerSequence& s) { s.alpha = nullptr; }, p);
  both([](LayerSequence& s) { s.kind = Recurrence::mamba2; }, p);  // beta given
  both([](LayerSequence&) {}, PrecisionPolicy::parse("conv:fp8b128"));  // dk = 64
  PrecisionPolicy bad = p;
  bad.window = 0;
  both([](LayerSequence&) {}, bad);
  CHECK_THROWS_AS(cuda::emulate_layer_sequence_gpu(d.view(L), p, 70000, nullptr), std::out_of_range);
  CHECK(test::contains(gpu_error([](LayerSequence& s) { s.dv = 300, s.ld_v = 1000, s.ld_out = 1000; }, p), "dv <= 256"));
  CHECK(test::contains(gpu_error([](LayerSequence& s) { s.dk = 320, s.ld_q = s.ld_k = 1000; }, p), "dk <= 256"));
  cuda::ScanCheckpoints wrong{d.out.data(), nullptr, 3};  // 8 tokens at L = 4 make 2 events
  CHECK(test::contains(gpu_error([](LayerSequence&) {}, p, &wrong), "2 over 8 tokens"));
  cuda::DeviceBuffer<int64_t> counts(4 * 2);
  cuda::DeviceBuffer<float> events_buffer(2 * 2 * 16 * 64);  // 2 heads x 2 events x 16 x 64
  cuda::ScanCheckpoints no_skip{events_buffer.data(), nullptr, 2, counts.data()};
  CHECK(test::contains(gpu_error([](LayerSequence&) {}, p, &no_skip), "which does not skip"));
  // conventional + skip: the CPU twin's refusal, word for word
  PrecisionPolicy conv_skip = PrecisionPolicy::parse("conv:fp16");
  conv_skip.skip.mode = ssm::CheckpointSkip::Mode::automatic;
  both([](LayerSequence&) {}, conv_skip);
}

namespace {

// Kernel time of one layer of `kind` and shape s at N = 131072 for each policy (printed). 4096
// random tokens, repeated on the device.
void time_layer(Recurrence kind, const Shape s, const char* what, std::initializer_list<const char*> policies) {
  const int block = 4096, n = 131072;
  const bool delta = ssm::has_delta_rule(kind);
  HostLayer B = make_layer(kind, s, block, true, test::kBaseSeed * 1000 + 7000, 0);
  cuda::DeviceBuffer<float> q(static_cast<std::size_t>(n) * B.ld_q), k(static_cast<std::size_t>(n) * B.ld_k),
      alpha(static_cast<std::size_t>(n) * B.ld_alpha), beta(delta ? static_cast<std::size_t>(n) * B.ld_beta : 0),
      v(static_cast<std::size_t>(n) * B.ld_v), out(static_cast<std::size_t>(n) * B.ld_out);
  auto fill = [&](cuda::DeviceBuffer<float>& dst, const std::vector<float>& src) {
    for (int r = 0; r < n / block; ++r)
      REPLAYSSM_CUDA_CHECK(cudaMemcpy(dst.data() + static_cast<std::size_t>(r) * src.size(), src.data(),
                                      src.size() * sizeof(float), cudaMemcpyHostToDevice));
  };
  fill(q, B.q), fill(k, B.k), fill(alpha, B.alpha), fill(v, B.v);
  if (delta) fill(beta, B.beta);
  LayerSequence seq;
  seq.kind = kind, seq.n_tokens = n, seq.dk = s.dk, seq.dv = s.dv;
  seq.n_key_heads = s.key_heads, seq.n_value_heads = s.heads();
  seq.q = q.data(), seq.k = k.data(), seq.alpha = alpha.data(), seq.beta = delta ? beta.data() : nullptr;
  seq.v = v.data(), seq.out = out.data();
  seq.ld_q = B.ld_q, seq.ld_k = B.ld_k, seq.ld_alpha = B.ld_alpha, seq.ld_beta = B.ld_beta, seq.ld_v = B.ld_v;
  seq.ld_out = B.ld_out;
  cudaEvent_t e0, e1;
  REPLAYSSM_CUDA_CHECK(cudaEventCreate(&e0));
  REPLAYSSM_CUDA_CHECK(cudaEventCreate(&e1));
  std::printf("[scan timing] %s layer (%s), %d key / %d value heads, dk = %d, dv = %d, N = %d\n", std::string(to_string(kind)).c_str(),
              what, s.key_heads, s.heads(), s.dk, s.dv, n);
  for (const char* text : policies) {
    const PrecisionPolicy p = PrecisionPolicy::parse(text);
    cuda::emulate_layer_sequence_gpu(seq, p, 0, nullptr);  // warm-up
    REPLAYSSM_CUDA_CHECK(cudaEventRecord(e0));
    cuda::emulate_layer_sequence_gpu(seq, p, 0, nullptr);
    REPLAYSSM_CUDA_CHECK(cudaEventRecord(e1));
    REPLAYSSM_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    REPLAYSSM_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    const std::vector<float> o = out.to_host();
    std::size_t finite = 0;
    for (float x : o) finite += std::isfinite(x);
    std::printf("  %-22s %9.1f ms  (%.0f tokens/s; %zu of %zu outputs finite)\n", text, ms, n / (ms * 1e-3), finite,
                o.size());
  }
  REPLAYSSM_CUDA_CHECK(cudaEventDestroy(e0));
  REPLAYSSM_CUDA_CHECK(cudaEventDestroy(e1));
}

}  // namespace

TEST_CASE("scan timing (printed, not asserted): Qwen3.5-4B GDN and tiny_mamba2 layers at N = 131072") {
  // Qwen3.5-4B GDN: 16 key heads, 32 value heads, dk = dv = 128.
  time_layer(Recurrence::gdn, {128, 128, 16, 2}, "Qwen3.5-4B", {"conv:fp32", "shared:nvfp4+sr@16", "split:nvfp4/fp32@16"});
  // The bundled tiny_mamba2: 2 groups, 8 heads, d_state 128, head dim 64.
  time_layer(Recurrence::mamba2, {128, 64, 2, 4}, "tiny_mamba2", {"conv:fp32", "shared:nvfp4+sr@16"});
}
