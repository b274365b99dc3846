// CUDA KDA (Kimi Delta Attention, channel-wise decay) decode kernels against the CPU literal decoders
// (ssm::ConventionalDecoder, ssm::ReplayDecoder, ssm::SplitPrecisionReplayDecoder with kda head-group
// shapes), on fresh random inputs from fixed recorded seeds (test::kBaseSeed + offset): conventional
// steps (fp32, fp16, bf16 state), ReplaySSM standard decode with staggered windows (shared fp32, split
// fp16/bf16/fp8b128/nvfp4 reads, fp32 or fp16+SR recurrence), verification of T in {1, 2, 4, 8} drafts
// with random accepted lengths, and standard steps after commits that leave h >= L; error feedback
// (+ef) on the conventional state and on either copy of ReplaySSM, and appendix F checkpoint-read
// skipping (with the host's count of what was skipped, from the decays). Decays per channel
// near 1, far from 1, mixed (each element slow with probability 1/4 at each token), or by head (the
// appendix F tests: fast heads beside heads with long channels). Outputs are
// poisoned (NaN) before every launch. Comparison rules as test_decode_cuda.cpp: FP32 paths
// |gpu - cpu| <= 1e-5 (rms + |cpu|) per element; low-precision paths allow flipped codes (at most
// 0.1% of elements beyond the FP32 tolerance, all within one code step), and every read (LP)
// checkpoint the GPU writes at a flush is bit-equal to formats::quantize_matrix of its own FP32 recur
// checkpoint. Skips (exit 77) without a CUDA device.
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_int_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cuda_bf16.h>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "gpu_test_util.h"
#include "decode_test_util.h"
#include "ssm/conventional_decode.h"
#include "ssm/decode_kernels.h"
#include "ssm/replay_decode.h"
#include "test_util.h"

using namespace replayssm;
using cuda::DecodeShape;
using formats::StorageFormat;

namespace {

using test::check_with_flips;
using test::out_offset;
using test::Collected;
using test::DeviceArray;
using test::ReadCopyHost;
using test::RecordBuffers;  // built with decay width dk: the KDA records' alpha
using test::StateBuffers;

const test::GpuGuard gpu_guard("KDA decode kernel tests");

constexpr ssm::Recurrence kKda = ssm::Recurrence::kda;


// by_head (appendix F tests): even value heads fast, every channel in 0.2-0.6 (a window's gamma falls
// below the auto thresholds of nvfp4, fp8, fp16 within about 3, 5, 11 tokens and of fp32 within ~21),
// odd value heads with every fourth channel slow at every token (0.999-1: gamma stays above 0.93 over
// 64 tokens, so they never skip) and the others in 0.3-0.8; so a launch holds blocks that skip and
// blocks that do not. (In `mixed` each element is drawn slow or fast per token, which decays too.)
enum class Decays { slow, fast, mixed, by_head };
const char* to_string(Decays d) {
  return d == Decays::slow    ? "slow"
         : d == Decays::fast  ? "fast"
         : d == Decays::mixed ? "mixed"
                              : "by head (fast 0.2-0.6 / a quarter of the channels slow)";
}

// One step's inputs for the whole batch (T tokens for verification); the float copies are exactly
// the bf16 values the GPU reads. alpha is [B][T][H][dk] (channel-wise), beta [B][T][H].
struct HostStep {
  int tokens = 1;
  std::vector<__nv_bfloat16> q, k, v;  // [B][T][G][dk], [B][T][H][dv]
  std::vector<float> qf, kf, vf, alpha, beta;
};

struct InputGen {
  boost::random::mt19937_64 rng;
  Decays decays;
  InputGen(uint64_t seed, Decays d) : rng(seed), decays(d) {}
  HostStep make(const DecodeShape& s, int tokens) {
    boost::random::normal_distribution<float> normal(0.0f, 1.0f);
    boost::random::uniform_real_distribution<float> unit(0.0f, 1.0f);
    HostStep st;
    st.tokens = tokens;
    const std::size_t nk = static_cast<std::size_t>(s.batch) * tokens * s.key_heads * s.dk;
    const std::size_t nv = static_cast<std::size_t>(s.batch) * tokens * s.value_heads * s.dv;
    st.q.resize(nk), st.k.resize(nk), st.v.resize(nv), st.qf.resize(nk), st.kf.resize(nk), st.vf.resize(nv);
    for (std::size_t base = 0; base < nk; base += s.dk) {
      // Kimi Linear L2-normalises q and k (as GDN).
      float nq = 0, nkk = 0;
      std::vector<float> q(s.dk), k(s.dk);
      for (int c = 0; c < s.dk; ++c) q[c] = normal(rng), k[c] = normal(rng), nq += q[c] * q[c], nkk += k[c] * k[c];
      for (int c = 0; c < s.dk; ++c) {
        st.q[base + c] = __float2bfloat16(q[c] / std::sqrt(nq)), st.k[base + c] = __float2bfloat16(k[c] / std::sqrt(nkk));
        st.qf[base + c] = __bfloat162float(st.q[base + c]), st.kf[base + c] = __bfloat162float(st.k[base + c]);
      }
    }
    for (std::size_t i = 0; i < nv; ++i) st.v[i] = __float2bfloat16(normal(rng)), st.vf[i] = __bfloat162float(st.v[i]);
    const std::size_t nh = static_cast<std::size_t>(s.batch) * tokens * s.value_heads;
    st.alpha.resize(nh * s.dk), st.beta.resize(nh);
    for (std::size_t i = 0; i < st.alpha.size(); ++i) {
      if (decays == Decays::by_head) {
        const bool fast_head = (i / s.dk) % s.value_heads % 2 == 0, slow_channel = i % s.dk % 4 == 0;
        st.alpha[i] = fast_head ? 0.2f + 0.4f * unit(rng) : slow_channel ? 0.999f + 0.001f * unit(rng) : 0.3f + 0.5f * unit(rng);
        continue;
      }
      const bool slow = decays == Decays::slow || (decays == Decays::mixed && unit(rng) < 0.25f);
      st.alpha[i] = slow ? 0.999f + 0.001f * unit(rng) : 0.3f + 0.5f * unit(rng);
    }
    for (float& b : st.beta) b = 0.05f + 0.9f * unit(rng);
    return st;
  }
};

struct DeviceStep {
  DeviceArray<__nv_bfloat16> q, k, v;
  DeviceArray<float> alpha, beta, out;
  DeviceStep(const HostStep& h, std::size_t out_elems)
      : q(h.q.size()), k(h.k.size()), v(h.v.size()), alpha(h.alpha.size()), beta(h.beta.size()), out(out_elems) {
    q.upload(h.q), k.upload(h.k), v.upload(h.v), alpha.upload(h.alpha), beta.upload(h.beta);
    out.upload(std::vector<float>(out_elems, std::numeric_limits<float>::quiet_NaN()));
  }
  cuda::StepInputs inputs() { return {q.ptr, k.ptr, v.ptr, alpha.ptr, beta.ptr, out.ptr}; }
};

// Token `tok` of sequence b, key head g, as the CPU decoder's GroupToken (pointers into h).
ssm::GroupToken group_token(const HostStep& h, const DecodeShape& s, int b, int g, int tok) {
  ssm::GroupToken t;
  const std::size_t kh = (static_cast<std::size_t>(b) * h.tokens + tok) * s.key_heads + g;
  t.q = &h.qf[kh * s.dk];
  t.k = &h.kf[kh * s.dk];
  for (int j = 0; j < s.heads_per_group(); ++j) {
    const std::size_t vh = (static_cast<std::size_t>(b) * h.tokens + tok) * s.value_heads + g * s.heads_per_group() + j;
    t.alpha.push_back(&h.alpha[vh * s.dk]);
    t.beta.push_back(h.beta[vh]);
    t.v.push_back(&h.vf[vh * s.dv]);
  }
  return t;
}

struct Case {
  const char* name;
  DecodeShape shape;  // batch, key heads, value heads, dk, dv
  Decays decays;
};

std::vector<Case> cases() {
  return {
      {"Kimi-Linear head shape (32 heads of dk = dv = 128, one value head per key head)", {2, 2, 2, 128, 128}, Decays::mixed},
      {"GQA 3, dk 64, dv 24", {3, 1, 3, 64, 24}, Decays::fast},
      {"GQA 2, dv 80, decays near 1", {2, 2, 4, 128, 80}, Decays::slow},
      {"dk 256, dv 16", {1, 1, 2, 256, 16}, Decays::mixed},
      {"batch 5, dk 64, dv 37", {5, 1, 1, 64, 37}, Decays::mixed},
  };
}

std::string describe(const Case& c) {
  const DecodeShape& s = c.shape;
  return std::string(c.name) + " [B=" + std::to_string(s.batch) + " G=" + std::to_string(s.key_heads) +
         " H=" + std::to_string(s.value_heads) + " dk=" + std::to_string(s.dk) + " dv=" + std::to_string(s.dv) +
         ", decays " + to_string(c.decays) + "]";
}

ssm::HeadGroupShape group_shape(const DecodeShape& s) { return {kKda, s.dk, s.dv, s.heads_per_group()}; }

// Verification of T drafts on the GPU and on the CPU decoders (then commit acc[b]); the outputs into meter.
void verify_round(const Case& c, int T, const HostStep& h, cuda::ReplayConfig& config, RecordBuffers& rec,
                  DeviceArray<int>& accepted, const std::vector<int>& acc,
                  std::vector<std::unique_ptr<ssm::ReplayDecoder>>& cpu, Collected& meter) {
  const DecodeShape& s = c.shape;
  DeviceStep d(h, s.heads() * s.dv * T);
  cuda::verify_step(kKda, s, T, d.inputs(), config, rec.view, nullptr);
  accepted.upload(acc);
  cuda::commit_step(s, accepted.ptr, rec.view, nullptr);
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = d.out.download();
  const std::size_t per_token = static_cast<std::size_t>(s.heads_per_group()) * s.dv;
  for (int b = 0; b < s.batch; ++b)
    for (int g = 0; g < s.key_heads; ++g) {
      std::vector<ssm::GroupToken> drafts;
      for (int t = 0; t < T; ++t) drafts.push_back(group_token(h, s, b, g, t));
      std::vector<float> ref(T * per_token);
      auto& dec = *cpu[static_cast<std::size_t>(b) * s.key_heads + g];
      dec.verify(drafts, ref.data());
      dec.commit(acc[b]);
      for (int t = 0; t < T; ++t)
        meter.add(out, out_offset(s, b, T, t, g),
                  std::vector<float>(ref.begin() + static_cast<std::ptrdiff_t>(t * per_token),
                                     ref.begin() + static_cast<std::ptrdiff_t>((t + 1) * per_token)),
                  out_offset(s, b, 1, 0, g));
    }
}

// One standard step on the GPU and the CPU decoders; the outputs into meter. With `committed` (each
// sequence's h as the caller counts it), the step takes the flush list those give (ReplayConfig::flush_list).
template <class Decoder>
void standard_step(const Case& c, const HostStep& h, cuda::ReplayConfig& config, RecordBuffers& rec,
                   std::vector<std::unique_ptr<Decoder>>& cpu, Collected& meter, const std::vector<int>* committed = nullptr) {
  const DecodeShape& s = c.shape;
  DeviceStep d(h, s.heads() * s.dv);
  test::FlushList flushing(s.batch);
  cuda::replay_step(kKda, s, d.inputs(), committed ? flushing.listed(config, *committed) : config, rec.view, nullptr);
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto out = d.out.download();
  for (int b = 0; b < s.batch; ++b)
    for (int g = 0; g < s.key_heads; ++g) {
      std::vector<float> ref(static_cast<std::size_t>(s.heads_per_group()) * s.dv);
      cpu[static_cast<std::size_t>(b) * s.key_heads + g]->step(group_token(h, s, b, g, 0), ref.data());
      meter.add(out, out_offset(s, b, 1, 0, g), ref);
    }
}

}  // namespace

namespace {

// 48 conventional steps of one case and policy against the CPU ConventionalDecoder: every output,
// FP32 within the FP32 tolerance, fp16/bf16 with flipped codes counted. With +ef the first step
// also starts both sides from the zero state, where S_1 = 0 Diag(a) + u k^T with u = b v is formed
// by the same float operations on both (no reduction order involved): the stored state must then
// equal the CPU's bit for bit, and the residual S_1 - Q(S_1) as well.
void conventional_case(const Case& c, const char* policy_text, uint64_t seed) {
  const DecodeShape& s = c.shape;
  const auto policy = ssm::PrecisionPolicy::parse(policy_text);
  const StorageFormat f = policy.recur.format;
  const bool ef = policy.recur.rounding == formats::Rounding::ef;
  std::vector<std::unique_ptr<ssm::ConventionalDecoder>> cpu;
  for (int b = 0; b < s.batch; ++b)
    for (int g = 0; g < s.key_heads; ++g)
      cpu.push_back(std::make_unique<ssm::ConventionalDecoder>(group_shape(s), policy,
                                                               ssm::HeadGroupId{static_cast<uint32_t>(b), static_cast<uint32_t>(g)}));
  StateBuffers state(f, s, ef);
  InputGen gen(seed, c.decays);
  Collected meter;
  int first_step_mismatch = 0;
  for (int step = 0; step < 48; ++step) {
    const HostStep h = gen.make(s, 1);
    DeviceStep d(h, s.heads() * s.dv);
    cuda::conventional_step(kKda, s, d.inputs(), state.view, nullptr, policy.recur.rounding);
    REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
    const auto out = d.out.download();
    for (int b = 0; b < s.batch; ++b)
      for (int g = 0; g < s.key_heads; ++g) {
        std::vector<float> ref(static_cast<std::size_t>(s.heads_per_group()) * s.dv);
        cpu[static_cast<std::size_t>(b) * s.key_heads + g]->step(group_token(h, s, b, g, 0), ref.data());
        meter.add(out, out_offset(s, b, 1, 0, g), ref);
      }
    if (!ef || step != 0) continue;
    const auto payload = state.payload.download();
    const auto residual = state.residual.download();
    const formats::ElementFormat element = f == StorageFormat::fp16 ? formats::ElementFormat::fp16 : formats::ElementFormat::bf16;
    for (int b = 0; b < s.batch; ++b)
      for (int g = 0; g < s.key_heads; ++g)
        for (int j = 0; j < s.heads_per_group(); ++j) {
          const std::size_t head = static_cast<std::size_t>(b) * s.value_heads + g * s.heads_per_group() + j;
          const auto& S = cpu[static_cast<std::size_t>(b) * s.key_heads + g]->state(j);
          const float beta = h.beta[head];
          for (int r = 0; r < s.dv; ++r)
            for (int col = 0; col < s.dk; ++col) {
              const std::size_t i = head * s.head_elements() + static_cast<std::size_t>(r) * s.dk + col;
              const uint32_t code = payload[2 * i] | (static_cast<uint32_t>(payload[2 * i + 1]) << 8);
              const float stored = formats::decode_element(element, code);
              // ssm::correction and ssm::decay_and_add on the zero state, in their order.
              const float u = beta * (h.vf[head * s.dv + r] - 0.0f);
              const float k = h.kf[(static_cast<std::size_t>(b) * s.key_heads + g) * s.dk + col];
              const float x = 0.0f * h.alpha[head * s.dk + col] + u * k;
              const float y = 0.0f + x;  // S + E, E zero before the first write
              const float cpu_stored = S(r, col), want_residual = y - cpu_stored;
              first_step_mismatch += std::memcmp(&stored, &cpu_stored, sizeof(float)) != 0 ||
                                     std::memcmp(&residual[i], &want_residual, sizeof(float)) != 0;
            }
        }
  }
  const double tol = f == StorageFormat::fp32 ? 1e-5 : f == StorageFormat::fp16 ? 2e-3 : 2e-2;
  const std::string what = "kda conventional " + std::string(policy_text) + " " + describe(c) + ", seed " + std::to_string(seed);
  const auto close = meter.close(tol, what);
  std::printf("%s: max |d|/allowed %.2f (tol %.0e), %zu mismatches of %zu%s\n", what.c_str(), close.max_excess, tol,
              close.mismatches, close.count,
              ef ? (", first-step state and residual bit mismatches " + std::to_string(first_step_mismatch)).c_str() : "");
  INFO(what);
  if (f == StorageFormat::fp32)
    CHECK_CLOSE(close);
  else
    check_with_flips(meter, tol, what);
  CHECK(first_step_mismatch == 0);
}

}  // namespace

// The conventional cases add dv = 192 at dk = 64: a kernel that splits an FP32 head's rows over blocks of
// 64 (conventional_row_parts, as the Mamba-2/GDN one does) runs it as three blocks per head.
namespace {
std::vector<Case> conventional_cases() {
  std::vector<Case> c = cases();
  c.push_back({"batch 3, dk 64, dv 192 (three row blocks per head)", {3, 1, 2, 64, 192}, Decays::mixed});
  return c;
}
}  // namespace

TEST_CASE("KDA conventional decode kernels equal the CPU conventional decoder (fp32; fp16/bf16 state)") {
  int n = 0;
  for (const Case& c : conventional_cases())
    for (const char* policy_text : {"conv:fp32", "conv:fp16+rtn", "conv:bf16+rtn"})
      conventional_case(c, policy_text, test::kBaseSeed + 57000 + n++);
}

// +ef (ssm::quantize_state with a residual): the stored state is Q_rtn(S + E) and E <- (S + E) - Q_rtn(S + E).
TEST_CASE("KDA conventional decode kernels with error feedback (conv:fp16+ef, conv:bf16+ef) equal the CPU conventional decoder") {
  int n = 0;
  for (const Case& c : conventional_cases())
    for (const char* policy_text : {"conv:fp16+ef", "conv:bf16+ef"})
      conventional_case(c, policy_text, test::kBaseSeed + 67000 + n++);
}

namespace {

// Appendix F on the host, from the generated decays, as ssm::ReplayDecoderBase::skips_checkpoint_read
// decides it: per (sequence, value head), gamma = the float32 product of the window's decay vectors in
// token order from position 0, the current token's included, largest over the key channels; a step
// skips when gamma is below the threshold of the copy it reads (a flush: the recur copy's). Counts
// what a case contained, so that a skip test that never skips fails.
struct SkipCounter {
  int dk, L;
  float read_threshold, flush_threshold;
  std::vector<std::vector<float>> window;  // per (b, head): the window's decay vectors, [n][dk]
  std::vector<int> head_skips;             // per (b, head): skipped reads and flushes
  int reads = 0, skipped_reads = 0, flushes = 0, skipped_flushes = 0;
  SkipCounter(const DecodeShape& s, int window_length, float read, float flush)
      : dk(s.dk), L(window_length), read_threshold(read), flush_threshold(flush), window(s.heads()), head_skips(s.heads()) {
    for (std::size_t hb = 0; hb < window.size(); ++hb)  // staggered starts: b % L neutral records (a = 1)
      window[hb].assign(static_cast<std::size_t>(hb / s.value_heads % L) * dk, 1.0f);
  }
  void step(const HostStep& h) {
    for (std::size_t hb = 0; hb < window.size(); ++hb) {
      std::vector<float>& w = window[hb];
      const auto token = h.alpha.begin() + static_cast<std::ptrdiff_t>(hb * dk);
      w.insert(w.end(), token, token + dk);
      const int n = static_cast<int>(w.size()) / dk;
      std::vector<float> gamma(w.begin(), w.begin() + dk);
      for (int j = 1; j < n; ++j)
        for (int c = 0; c < dk; ++c) gamma[c] *= w[static_cast<std::size_t>(j) * dk + c];
      const float g = *std::max_element(gamma.begin(), gamma.end());
      const bool flush = n >= L, skip = g < (flush ? flush_threshold : read_threshold);
      head_skips[hb] += skip;
      if (flush) {
        ++flushes, skipped_flushes += skip;
        w.clear();
      } else {
        ++reads, skipped_reads += skip;
      }
    }
  }
  int heads_that_skipped() const {
    return static_cast<int>(std::count_if(head_skips.begin(), head_skips.end(), [](int k) { return k > 0; }));
  }
};

// 3L + 5 standard steps of one case and policy against the CPU decoders (ssm::make_decoder of the
// policy text), sequence b starting at window position b % L (neutral records on both sides) so that
// flush and non-flush blocks share launches. Outputs: FP32 paths within the FP32 tolerance, others
// with flipped codes counted. After a flush of sequence b with an FP32 recur copy, its read (LP) copy
// must be the RTN quantization of the GPU's own recur copy bit for bit; with ef on the read copy, of
// recur + the residual before the step, and the residual after it must be (recur + before) - Q(...)
// bit for bit. Returns the host's appendix F counts (all zero without skipping).
SkipCounter replay_case(const Case& c, const std::string& policy_text, Decays decays, uint64_t seed) {
  const DecodeShape& s = c.shape;
  const auto policy = ssm::PrecisionPolicy::parse(policy_text);
  const int L = policy.window;
  const bool split = policy.scheme == ssm::DecodeScheme::split;
  const bool read_ef = split && policy.read.rounding == formats::Rounding::ef;
  std::vector<cuda::WindowState> initial(s.batch);
  for (int b = 0; b < s.batch; ++b) initial[b].h = b % L;
  HostStep neutral;
  neutral.tokens = 1;
  neutral.qf.assign(static_cast<std::size_t>(s.batch) * s.key_heads * s.dk, 0.0f);
  neutral.kf = neutral.qf;
  neutral.vf.assign(static_cast<std::size_t>(s.batch) * s.value_heads * s.dv, 0.0f);
  neutral.alpha.assign(static_cast<std::size_t>(s.batch) * s.value_heads * s.dk, 1.0f);
  neutral.beta.assign(static_cast<std::size_t>(s.batch) * s.value_heads, 0.5f);
  std::vector<std::unique_ptr<ssm::HeadGroupDecoder>> cpu;
  for (int b = 0; b < s.batch; ++b)
    for (int g = 0; g < s.key_heads; ++g) {
      cpu.push_back(ssm::make_decoder(group_shape(s), policy, {static_cast<uint32_t>(b), static_cast<uint32_t>(g)}));
      std::vector<float> scratch(static_cast<std::size_t>(s.heads_per_group()) * s.dv);
      for (int w = 0; w < b % L; ++w) cpu.back()->step(group_token(neutral, s, b, g, 0), scratch.data());
    }
  StateBuffers recur_buf(policy.recur.format, s, policy.recur.rounding == formats::Rounding::ef);
  std::unique_ptr<StateBuffers> read_buf;
  cuda::ReplayConfig config;
  config.window = L;
  config.recur = recur_buf.view;
  config.recur_rounding = policy.recur.rounding;
  config.seed = policy.seed;
  if (split) {
    read_buf = std::make_unique<StateBuffers>(policy.read.format, s, read_ef);
    config.read = read_buf->view;
    config.read_rounding = policy.read.rounding;
  }
  config.skip_threshold_read = policy.skip.threshold_for(split ? policy.read : policy.recur);
  config.skip_threshold_flush = policy.skip.threshold_for(policy.recur);
  SkipCounter skips(s, L, config.skip_threshold_read, config.skip_threshold_flush);
  RecordBuffers rec(s, L, initial, s.dk);
  InputGen gen(seed, decays);
  Collected meter;
  const bool check_read = split && policy.recur.format == StorageFormat::fp32;
  int read_checks = 0, read_mismatch = 0, first_bad_step = -1;
  for (int step = 0; step < 3 * L + 5; ++step) {
    const HostStep h = gen.make(s, 1);
    skips.step(h);
    const std::vector<float> residual_before = check_read && read_ef ? read_buf->residual.download() : std::vector<float>();
    // Every other step with a flush list from the staggered positions h_b = (b mod L + step) mod L.
    std::vector<int> committed(s.batch);
    for (int b = 0; b < s.batch; ++b) committed[b] = (b % L + step) % L;
    standard_step(c, h, config, rec, cpu, meter, step % 2 ? &committed : nullptr);
    if (!check_read) continue;
    std::vector<float> recur_host(s.heads() * s.head_elements());
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(recur_host.data(), recur_buf.payload.ptr, recur_host.size() * 4, cudaMemcpyDeviceToHost));
    const std::vector<float> residual_after = read_ef ? read_buf->residual.download() : std::vector<float>();
    const ReadCopyHost read_copy(*read_buf);
    for (int b = 0; b < s.batch; ++b) {
      if ((b % L + step + 1) % L != 0) continue;  // not flushed at this step
      for (int hd = 0; hd < s.value_heads; ++hd) {
        const std::size_t head = static_cast<std::size_t>(b) * s.value_heads + hd, at = head * s.head_elements();
        const bool same = read_copy.equals_quantized(&recur_host[at], s.dv, s.dk, head, read_ef ? &residual_before[at] : nullptr,
                                                     read_ef ? &residual_after[at] : nullptr);
        ++read_checks;
        if (!same && first_bad_step < 0) first_bad_step = step;
        read_mismatch += !same;
      }
    }
  }
  const bool fp32_path = policy.recur.format == StorageFormat::fp32 && (!split || policy.read.format == StorageFormat::fp32);
  const double tol = fp32_path ? 1e-5 : policy.recur.format == StorageFormat::fp32 ? 5e-3 : 2e-2;
  const std::string what =
      "kda replay " + policy_text + " " + describe(Case{c.name, c.shape, decays}) + ", seed " + std::to_string(seed);
  const auto close = meter.close(tol, what);
  std::printf("%s: max |d|/allowed %.2f (tol %.0e), %zu mismatches of %zu%s%s\n", what.c_str(), close.max_excess, tol,
              close.mismatches, close.count,
              read_checks ? (", read (LP) checkpoints bit-equal: " + std::to_string(read_checks - read_mismatch) + "/" +
                             std::to_string(read_checks) +
                             (first_bad_step >= 0 ? " (first mismatch at step " + std::to_string(first_bad_step) + ")" : ""))
                                .c_str()
                          : "",
              policy.skip.mode != ssm::CheckpointSkip::Mode::off
                  ? (", skipped reads " + std::to_string(skips.skipped_reads) + "/" + std::to_string(skips.reads) + ", flushes " +
                     std::to_string(skips.skipped_flushes) + "/" + std::to_string(skips.flushes) + ", heads that skipped " +
                     std::to_string(skips.heads_that_skipped()) + "/" + std::to_string(s.heads()))
                        .c_str()
                  : "");
  INFO(what);
  if (fp32_path)
    CHECK_CLOSE(close);
  else
    check_with_flips(meter, tol, what);
  CHECK(read_mismatch == 0);
  return skips;
}

}  // namespace

TEST_CASE("KDA ReplaySSM decode kernels equal the CPU decoders: shared fp32 and split low-precision reads, staggered windows") {
  int n = 0;
  for (const Case& c : cases())
    for (const char* policy_text : {"shared:fp32@1", "shared:fp32@4", "shared:fp32@16", "shared:fp32@64", "split:fp16/fp32@8",
                                    "split:bf16/fp32@8", "split:fp8b128/fp32@16", "split:nvfp4/fp32@16",
                                    "split:nvfp4/fp32@33", "split:fp8b128/fp16+sr@4"}) {
      if (ssm::PrecisionPolicy::parse(policy_text).read.format == StorageFormat::fp8b128 && c.shape.dk % 128) continue;
      replay_case(c, policy_text, c.decays, test::kBaseSeed + 59000 + n++);
    }
}

// Error feedback on either copy (ssm::ReplayDecoderBase::write_checkpoints): the read (LP) copy of a
// split policy (its NVFP4 tensor scale from the amax of S + E), a shared fp16 checkpoint, and the
// fp16 recur copy of a split policy. An NVFP4 read copy needs an FP32 recur copy (the flush re-reads
// S from it), so the fp16+ef recur copy is paired with fp8b128 and bf16 read copies; with an fp16
// recur copy the CPU and GPU may diverge by flipped codes, which the output comparison counts.
TEST_CASE("KDA ReplaySSM decode kernels with error feedback (+ef) on the read or the recurrence copy equal the CPU decoders") {
  int n = 0;
  for (const Case& c : cases())
    for (const char* policy_text : {"shared:fp16+ef@16", "split:nvfp4+ef/fp32@16", "split:fp8b128+ef/fp32@16", "split:fp16+ef/fp32@8",
                                    "split:fp8b128+rtn/fp16+ef@16", "split:bf16+rtn/fp16+ef@8"}) {
      if (ssm::PrecisionPolicy::parse(policy_text).read.format == StorageFormat::fp8b128 && c.shape.dk % 128) continue;
      replay_case(c, policy_text, c.decays, test::kBaseSeed + 68000 + n++);
    }
}

// Appendix F: with decays by head (even heads fast, odd heads with a few slow channels) non-flush
// steps of the fast heads skip their read, and, where the recur copy's threshold is reached within a
// window, flushes become pure writes; the same launches hold heads that do not skip. The host counts
// from the generated decays what the CPU decoders (and so the kernels) skipped: a case that never
// skips fails.
TEST_CASE("KDA ReplaySSM decode kernels with appendix F checkpoint-read skipping equal the CPU decoders") {
  struct SkipPolicy {
    const char* text;
    bool flushes_skip;  // the recur copy's threshold is reached within the window on the fast heads
  };
  const SkipPolicy policies[] = {{"shared:fp32@64,skip=auto", true},      {"split:nvfp4/fp32@16,skip=auto", false},
                                 {"split:fp8b128/fp32@16,skip=auto", false}, {"shared:fp16@16,skip=auto", true},
                                 {"split:nvfp4/fp32@32,skip=auto", true},    {"shared:fp16+ef@16,skip=auto", true},
                                 {"split:nvfp4+ef/fp32@16,skip=auto", false}};
  int n = 0;
  for (const Case& c : cases())
    for (const SkipPolicy& sp : policies) {
      if (ssm::PrecisionPolicy::parse(sp.text).read.format == StorageFormat::fp8b128 && c.shape.dk % 128) continue;
      const int index = n++;
      if (!test::in_test_shard(index)) continue;
      const SkipCounter skips = replay_case(c, sp.text, Decays::by_head, test::kBaseSeed + 69000 + index);
      INFO(sp.text << " " << describe(Case{c.name, c.shape, Decays::by_head}));
      CHECK(skips.skipped_reads > 0);
      // Window position 0 never skips: its gamma, the largest of >= 64 channels of a_0 in 0.2-0.6, is far above 0.25.
      CHECK(skips.skipped_reads < skips.reads);
      if (sp.flushes_skip) CHECK(skips.skipped_flushes > 0);
      if (c.shape.value_heads > 1) CHECK(skips.heads_that_skipped() < static_cast<int>(c.shape.heads()));  // the odd heads
    }
}

TEST_CASE("KDA verification kernels equal CPU verify/commit (UT transform) with random accepted lengths") {
  boost::random::mt19937_64 rng(test::kBaseSeed + 61000);
  int n = 0;
  for (const Case& c : cases()) {
    for (int T : {1, 2, 4, 8}) {
      const DecodeShape& s = c.shape;
      const int L = 16;
      const auto policy = ssm::PrecisionPolicy::parse("shared:fp32@16");
      ssm::ReplayDecoderOptions opts;
      opts.max_draft = T;
      std::vector<std::unique_ptr<ssm::ReplayDecoder>> cpu;
      for (int b = 0; b < s.batch; ++b)
        for (int g = 0; g < s.key_heads; ++g)
          cpu.push_back(std::make_unique<ssm::ReplayDecoder>(group_shape(s), policy,
                                                             ssm::HeadGroupId{static_cast<uint32_t>(b), static_cast<uint32_t>(g)}, opts));
      StateBuffers ck(StorageFormat::fp32, s);
      cuda::ReplayConfig config;
      config.window = L;
      config.recur = ck.view;
      RecordBuffers rec(s, std::max(L, T) + T, std::vector<cuda::WindowState>(s.batch), s.dk);
      rec.view.max_drafts = T;
      DeviceArray<int> accepted(s.batch);
      const uint64_t seed = test::kBaseSeed + 62000 + n;
      InputGen gen(seed, c.decays);
      Collected meter;
      int flushes = 0;
      for (int round = 0; round < 24; ++round) {
        for (int b = 0; b < s.batch; ++b) flushes += cpu[static_cast<std::size_t>(b) * s.key_heads]->committed() + T > L;
        const HostStep h = gen.make(s, T);
        std::vector<int> acc(s.batch);
        for (int b = 0; b < s.batch; ++b) acc[b] = boost::random::uniform_int_distribution<int>(1, T)(rng);
        verify_round(c, T, h, config, rec, accepted, acc, cpu, meter);
      }
      const std::string what = "kda verify T=" + std::to_string(T) + " L=16 " + describe(c) + ", seed " + std::to_string(seed);
      const auto close = meter.close(1e-5, what);
      std::printf("%s: %d flushing verifications; max |d|/allowed %.2f (tol 1e-5), %zu mismatches of %zu\n", what.c_str(),
                  flushes, close.max_excess, close.mismatches, close.count);
      INFO(what);
      CHECK(flushes > 0);
      CHECK_CLOSE(close);
      ++n;
    }
  }
}

// Algorithm 3 for KDA (decode_verify_split.cu): verification reads the LP copy when h + T <= L and
// the HP copy when h + T > L, a flush folds the committed records from the HP copy with every u_j^HP
// recomputed and writes both copies; also a shared checkpoint stored in fp16. Rounds of verify +
// commit (random accepted lengths) alternate with 0-2 standard steps, against the CPU decoders: every
// output; at the end the FP32 HP checkpoints and every LP copy bit-equal to the quantized GPU HP copy.
TEST_CASE("KDA split-precision verification (Algorithm 3) and fp16 shared verification equal the CPU decoders") {
  boost::random::mt19937_64 rng(test::kBaseSeed + 65000);
  struct PolicyCase {
    const char* policy;
    int T;
  };
  const PolicyCase policies[] = {{"split:fp16/fp32@16", 4}, {"split:nvfp4/fp32@5", 8}, {"split:fp8b128/fp16+sr@8", 4},
                                 {"split:bf16/fp32@16", 2}, {"shared:fp16+sr@16", 8},
                                 // error feedback (+ef) on the LP copy and on an fp16 recurrence copy
                                 {"split:nvfp4+ef/fp32@16", 8}, {"split:fp16+ef/fp32@4", 2}, {"shared:fp16+ef@16", 4}};
  int n = 0;
  for (const Case& c : cases()) {
    for (const PolicyCase& pc : policies) {
      const DecodeShape& s = c.shape;
      const auto policy = ssm::PrecisionPolicy::parse(pc.policy);
      if (policy.read.format == StorageFormat::fp8b128 && s.dk % 128) continue;
      const int L = policy.window, T = pc.T;
      const bool split = policy.scheme == ssm::DecodeScheme::split;
      ssm::ReplayDecoderOptions opts;
      opts.max_draft = T;
      std::vector<std::unique_ptr<ssm::HeadGroupDecoder>> owner;
      std::vector<ssm::ReplayDecoderBase*> cpu;
      for (int b = 0; b < s.batch; ++b)
        for (int g = 0; g < s.key_heads; ++g) {
          owner.push_back(ssm::make_decoder(group_shape(s), policy, {static_cast<uint32_t>(b), static_cast<uint32_t>(g)}, opts));
          cpu.push_back(dynamic_cast<ssm::ReplayDecoderBase*>(owner.back().get()));
          REQUIRE(cpu.back() != nullptr);
        }
      const bool read_ef = split && policy.read.rounding == formats::Rounding::ef;
      StateBuffers recur_buf(policy.recur.format, s, policy.recur.rounding == formats::Rounding::ef);
      std::unique_ptr<StateBuffers> read_buf;
      cuda::ReplayConfig config;
      config.window = L;
      config.recur = recur_buf.view;
      config.recur_rounding = policy.recur.rounding;
      config.seed = policy.seed;
      if (split) {
        read_buf = std::make_unique<StateBuffers>(policy.read.format, s, read_ef);
        config.read = read_buf->view;
        config.read_rounding = policy.read.rounding;
      }
      RecordBuffers rec(s, std::max(L, T) + T, std::vector<cuda::WindowState>(s.batch), s.dk);
      rec.view.max_drafts = T;
      DeviceArray<int> accepted(s.batch);
      const uint64_t seed = test::kBaseSeed + 66000 + n;
      InputGen gen(seed, c.decays);
      Collected meter;
      int lp_verifies = 0, folding_verifies = 0, ef_checks = 0, ef_mismatch = 0;
      const std::size_t per_token = static_cast<std::size_t>(s.heads_per_group()) * s.dv;
      // 12 rounds, and more (up to 200) until a verification has folded: with random accepted lengths
      // and standard steps flushing at h = L - 1, whether a verify lands on h + T > L is chance.
      for (int round = 0; round < 12 || (folding_verifies == 0 && round < 200); ++round) {
        // Error feedback on the LP copy: each fold's write is checked against the residual before it.
        const std::vector<float> residual_before = read_ef ? read_buf->residual.download() : std::vector<float>{};
        std::vector<char> folded(s.batch, 0);
        {
          const HostStep h = gen.make(s, T);
          std::vector<int> acc(s.batch);
          for (int b = 0; b < s.batch; ++b) acc[b] = boost::random::uniform_int_distribution<int>(1, T)(rng);
          DeviceStep d(h, s.heads() * s.dv * T);
          cuda::verify_step(kKda, s, T, d.inputs(), config, rec.view, nullptr);
          accepted.upload(acc);
          cuda::commit_step(s, accepted.ptr, rec.view, nullptr);
          REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
          const auto out = d.out.download();
          for (int b = 0; b < s.batch; ++b)
            for (int g = 0; g < s.key_heads; ++g) {
              auto& dec = *cpu[static_cast<std::size_t>(b) * s.key_heads + g];
              folded[b] = dec.committed() + T > L && dec.committed() > 0;
              lp_verifies += dec.committed() + T <= L;
              folding_verifies += dec.committed() + T > L && dec.committed() > 0;
              std::vector<ssm::GroupToken> drafts;
              for (int t = 0; t < T; ++t) drafts.push_back(group_token(h, s, b, g, t));
              std::vector<float> ref(T * per_token);
              dec.verify(drafts, ref.data());
              dec.commit(acc[b]);
              for (int t = 0; t < T; ++t)
                meter.add(out, out_offset(s, b, T, t, g),
                          std::vector<float>(ref.begin() + static_cast<std::ptrdiff_t>(t * per_token),
                                             ref.begin() + static_cast<std::ptrdiff_t>((t + 1) * per_token)),
                          out_offset(s, b, 1, 0, g));
            }
        }
        if (read_ef && policy.recur.format == StorageFormat::fp32)
          test::check_lp_writes(recur_buf, *read_buf, residual_before, folded, s, ef_checks, ef_mismatch);
        const int steps = boost::random::uniform_int_distribution<int>(0, 2)(rng);
        for (int st = 0; st < steps; ++st) {
          const HostStep h = gen.make(s, 1);
          DeviceStep d(h, s.heads() * s.dv);
          cuda::replay_step(kKda, s, d.inputs(), config, rec.view, nullptr);
          REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
          const auto out = d.out.download();
          for (int b = 0; b < s.batch; ++b)
            for (int g = 0; g < s.key_heads; ++g) {
              std::vector<float> ref(per_token);
              cpu[static_cast<std::size_t>(b) * s.key_heads + g]->step(group_token(h, s, b, g, 0), ref.data());
              meter.add(out, out_offset(s, b, 1, 0, g), ref);
            }
        }
      }
      Collected states;
      int read_checks = 0, read_mismatch = 0;
      if (policy.recur.format == StorageFormat::fp32) {
        const auto recur_bytes = recur_buf.payload.download();
        const float* gs = reinterpret_cast<const float*>(recur_bytes.data());
        std::unique_ptr<ReadCopyHost> read_copy;
        if (split) read_copy = std::make_unique<ReadCopyHost>(*read_buf);
        for (int b = 0; b < s.batch; ++b)
          for (int g = 0; g < s.key_heads; ++g)
            for (int j = 0; j < s.heads_per_group(); ++j) {
              const auto& dec = *cpu[static_cast<std::size_t>(b) * s.key_heads + g];
              const auto& S = split ? static_cast<const ssm::SplitPrecisionReplayDecoder&>(dec).recur_checkpoint(j)
                                    : static_cast<const ssm::ReplayDecoder&>(dec).checkpoint(j);
              const std::size_t head = static_cast<std::size_t>(b) * s.value_heads + g * s.heads_per_group() + j;
              std::vector<float> gpu_head(gs + head * s.head_elements(), gs + (head + 1) * s.head_elements());
              states.add(gpu_head, 0, std::vector<float>(S.data(), S.data() + S.size()));
              if (!split || dec.flushes() == 0 || read_ef) continue;  // ef: checked at each fold
              const bool same = read_copy->equals_quantized(gpu_head.data(), s.dv, s.dk, head);
              ++read_checks;
              read_mismatch += !same;
            }
      }
      const double tol = policy.recur.format == StorageFormat::fp32 ? 5e-3 : 2e-2;
      const std::string what = "kda low-precision verify " + std::string(pc.policy) + " T=" + std::to_string(T) + " " +
                               describe(c) + ", seed " + std::to_string(seed);
      const auto close = meter.close(tol, what);
      std::printf("%s: %d LP verifies, %d folding verifies; max |d|/allowed %.2f (tol %.0e)", what.c_str(), lp_verifies,
                  folding_verifies, close.max_excess, tol);
      if (!states.gpu.empty()) std::printf(", HP checkpoints %.2f", states.close(1e-5, "HP").max_excess);
      if (read_checks) std::printf(", LP copies bit-equal %d/%d", read_checks - read_mismatch, read_checks);
      std::printf("\n");
      INFO(what);
      check_with_flips(meter, tol, what);
      if (!states.gpu.empty()) CHECK_CLOSE(states.close(1e-5, what + " FP32 HP checkpoints"));
      CHECK(read_mismatch == 0);
      if (read_ef) {
        MESSAGE(pc.policy << ": LP copies and residuals bit-equal at " << ef_checks - ef_mismatch << " of " << ef_checks
                          << " folds");
        CHECK(ef_checks > 0);
        CHECK(ef_mismatch == 0);
      }
      CHECK(folding_verifies > 0);
      if (T <= L) CHECK(lp_verifies > 0);
      ++n;
    }
  }
}

// Standard steps after verification commits: a commit can leave h = L committed records (no flush)
// or, with T > L, h = T > L after a flush; the next standard step folds all h + 1 records. Rounds
// of verify + commit alternate with one to three standard steps, against the CPU ReplayDecoder:
// every output, and every checkpoint at the end.
TEST_CASE("KDA standard steps after verification commits (h >= L) equal the CPU decoder, outputs and checkpoints") {
  boost::random::mt19937_64 rng(test::kBaseSeed + 63000);
  int n = 0;
  for (const Case& c : cases()) {
    int case_long_flushes = 0;
    for (const auto& [L, T] : {std::pair{4, 8}, std::pair{16, 8}, std::pair{8, 2}, std::pair{5, 4}}) {
      const DecodeShape& s = c.shape;
      const auto policy = ssm::PrecisionPolicy::parse("shared:fp32@" + std::to_string(L));
      ssm::ReplayDecoderOptions opts;
      opts.max_draft = T;
      std::vector<std::unique_ptr<ssm::ReplayDecoder>> cpu;
      for (int b = 0; b < s.batch; ++b)
        for (int g = 0; g < s.key_heads; ++g)
          cpu.push_back(std::make_unique<ssm::ReplayDecoder>(group_shape(s), policy,
                                                             ssm::HeadGroupId{static_cast<uint32_t>(b), static_cast<uint32_t>(g)}, opts));
      StateBuffers ck(StorageFormat::fp32, s);
      cuda::ReplayConfig config;
      config.window = L;
      config.recur = ck.view;
      RecordBuffers rec(s, std::max(L, T) + T, std::vector<cuda::WindowState>(s.batch), s.dk);
      rec.view.max_drafts = T;
      DeviceArray<int> accepted(s.batch);
      const uint64_t seed = test::kBaseSeed + 64000 + n;
      InputGen gen(seed, c.decays);
      Collected meter;
      int long_flushes = 0;  // standard steps that found h >= L committed records
      for (int round = 0; round < 20; ++round) {
        // Half the time aimed at h >= L: without a flush (h + T <= L) accept L - h when that is 1..T
        // (leaves h = L); after a flush accept T (leaves h = T). Otherwise uniform in 1..T.
        std::vector<int> acc(s.batch);
        for (int b = 0; b < s.batch; ++b) {
          const int h0 = cpu[static_cast<std::size_t>(b) * s.key_heads]->committed();
          const int aimed = h0 + T <= L ? std::clamp(L - h0, 1, T) : T;
          acc[b] = boost::random::uniform_int_distribution<int>(0, 1)(rng) ? aimed
                                                                           : boost::random::uniform_int_distribution<int>(1, T)(rng);
        }
        verify_round(c, T, gen.make(s, T), config, rec, accepted, acc, cpu, meter);
        const int steps = boost::random::uniform_int_distribution<int>(1, 3)(rng);
        for (int st = 0; st < steps; ++st) {
          std::vector<int> committed(s.batch);
          for (int b = 0; b < s.batch; ++b) {
            committed[b] = cpu[static_cast<std::size_t>(b) * s.key_heads]->committed();
            long_flushes += committed[b] >= L;
          }
          // Every other round with the flush list the CPU decoders' h give (after a commit h can be L or more).
          standard_step(c, gen.make(s, 1), config, rec, cpu, meter, round % 2 ? &committed : nullptr);
        }
      }
      Collected states;
      const auto gpu_state = ck.payload.download();
      const float* gs = reinterpret_cast<const float*>(gpu_state.data());
      for (int b = 0; b < s.batch; ++b)
        for (int g = 0; g < s.key_heads; ++g)
          for (int j = 0; j < s.heads_per_group(); ++j) {
            const auto& S = cpu[static_cast<std::size_t>(b) * s.key_heads + g]->checkpoint(j);
            const std::size_t head = static_cast<std::size_t>(b) * s.value_heads + g * s.heads_per_group() + j;
            states.add(std::vector<float>(gs + head * s.head_elements(), gs + (head + 1) * s.head_elements()), 0,
                       std::vector<float>(S.data(), S.data() + S.size()));
          }
      const std::string what = "kda verify/standard mix L=" + std::to_string(L) + " T=" + std::to_string(T) + " " +
                               describe(c) + ", seed " + std::to_string(seed);
      const auto close = meter.close(1e-5, what + " outputs"), close_states = states.close(1e-5, what + " checkpoints");
      std::printf("%s: %d standard steps with h >= L; max |d|/allowed outputs %.2f, checkpoints %.2f\n", what.c_str(),
                  long_flushes, close.max_excess, close_states.max_excess);
      INFO(what);
      case_long_flushes += long_flushes;
      if (T > L) CHECK(long_flushes > 0);
      CHECK_CLOSE(close);
      CHECK_CLOSE(close_states);
      ++n;
    }
    CHECK(case_long_flushes > 0);
  }
}

TEST_CASE("the KDA launchers refuse bad input with std::invalid_argument naming the field") {
  const DecodeShape s{2, 2, 2, 128, 64};
  StateBuffers ck(StorageFormat::fp32, s);
  cuda::ReplayConfig config;
  config.window = 16;
  config.recur = ck.view;
  HostStep h = InputGen(test::kBaseSeed + 65000, Decays::mixed).make(s, 8);
  DeviceStep d(h, s.heads() * s.dv * 8);
  RecordBuffers rec(s, 16 + 8, std::vector<cuda::WindowState>(s.batch), s.dk);
  rec.view.max_drafts = 8;
  auto refusal = [](auto&& f) { return test::error_of<std::invalid_argument>(f); };
  auto expect = [](const std::string& message, const std::string& field) {
    INFO("message: " << message << "; expected to name " << field);
    CHECK(test::contains(message, field));
  };
  {
    cuda::StepInputs in = d.inputs();
    in.alpha = nullptr;
    expect(refusal([&] { cuda::conventional_step(kKda, s, in, ck.view, nullptr); }), "alpha");
    expect(refusal([&] { cuda::replay_step(kKda, s, in, config, rec.view, nullptr); }), "alpha");
    in = d.inputs();
    in.beta = nullptr;
    expect(refusal([&] { cuda::verify_step(kKda, s, 4, in, config, rec.view, nullptr); }), "beta");
  }
  {
    StateBuffers fp8(StorageFormat::fp8b128, s);
    expect(refusal([&] { cuda::conventional_step(kKda, s, d.inputs(), fp8.view, nullptr); }), "format");
  }
  {
    cuda::ReplayConfig wide = config;
    wide.heads_per_block = 2;
    expect(refusal([&] { cuda::replay_step(kKda, s, d.inputs(), wide, rec.view, nullptr); }), "heads_per_block");
    expect(refusal([&] { cuda::verify_step(kKda, s, 4, d.inputs(), wide, rec.view, nullptr); }), "heads_per_block");
  }
  {
    cuda::DeviceRecords no_alpha = rec.view;
    no_alpha.alpha = nullptr;
    expect(refusal([&] { cuda::replay_step(kKda, s, d.inputs(), config, no_alpha, nullptr); }), "alpha");
    cuda::DeviceRecords small = rec.view;
    small.capacity = 16 + 7;  // needs max(16, 8) + 8
    expect(refusal([&] { cuda::replay_step(kKda, s, d.inputs(), config, small, nullptr); }), "capacity");
    expect(refusal([&] { cuda::verify_step(kKda, s, 8, d.inputs(), config, small, nullptr); }), "capacity");
  }
  {
    expect(refusal([&] { cuda::verify_step(kKda, s, 3, d.inputs(), config, rec.view, nullptr); }), "T");
    expect(refusal([&] { cuda::verify_step(kKda, s, 16, d.inputs(), config, rec.view, nullptr); }), "T");
    StateBuffers lp(StorageFormat::nvfp4, s);
    cuda::ReplayConfig split = config;
    split.read = lp.view;
    // Split verification runs (Algorithm 3), but an NVFP4 LP copy needs an fp32 HP copy, in every kernel.
    StateBuffers hp16(StorageFormat::fp16, s);
    split.recur = hp16.view;
    expect(refusal([&] { cuda::verify_step(kKda, s, 4, d.inputs(), split, rec.view, nullptr); }), "fp32 recurrence");
    expect(refusal([&] { cuda::replay_step(kKda, s, d.inputs(), split, rec.view, nullptr); }), "fp32 recurrence");
  }
  {
    const DecodeShape small_dk{2, 2, 2, 64, 64};
    StateBuffers ck64(StorageFormat::fp32, small_dk), lp(StorageFormat::fp8b128, DecodeShape{2, 2, 2, 128, 64});
    cuda::ReplayConfig split = config;
    split.recur = ck64.view;
    split.read = lp.view;
    RecordBuffers rec64(small_dk, 16, std::vector<cuda::WindowState>(small_dk.batch), small_dk.dk);
    HostStep h64 = InputGen(test::kBaseSeed + 65001, Decays::mixed).make(small_dk, 1);
    DeviceStep d64(h64, small_dk.heads() * small_dk.dv);
    expect(refusal([&] { cuda::replay_step(kKda, small_dk, d64.inputs(), split, rec64.view, nullptr); }), "dk");
  }
  {
    // Error feedback exactly on a copy with a residual buffer (decode_kernels.h, DeviceState::residual),
    // never on fp32 state, and the conventional kernels do not round with SR.
    StateBuffers fp16(StorageFormat::fp16, s), fp16_ef(StorageFormat::fp16, s, true), fp32_ef(StorageFormat::fp32, s, true);
    expect(refusal([&] { cuda::conventional_step(kKda, s, d.inputs(), fp16.view, nullptr, formats::Rounding::ef); }), "residual");
    expect(refusal([&] { cuda::conventional_step(kKda, s, d.inputs(), fp16_ef.view, nullptr, formats::Rounding::rtn); }), "residual");
    expect(refusal([&] { cuda::conventional_step(kKda, s, d.inputs(), fp32_ef.view, nullptr, formats::Rounding::ef); }), "fp32");
    expect(refusal([&] { cuda::conventional_step(kKda, s, d.inputs(), fp16.view, nullptr, formats::Rounding::sr); }), "SR");
    cuda::ReplayConfig ef = config;
    ef.recur = fp16.view;
    ef.recur_rounding = formats::Rounding::ef;
    expect(refusal([&] { cuda::replay_step(kKda, s, d.inputs(), ef, rec.view, nullptr); }), "residual");
    // An NVFP4 read copy needs an FP32 recur copy, with error feedback on the fp16 one as without.
    StateBuffers lp(StorageFormat::nvfp4, s);
    ef.recur = fp16_ef.view;
    ef.read = lp.view;
    expect(refusal([&] { cuda::replay_step(kKda, s, d.inputs(), ef, rec.view, nullptr); }), "fp32 recurrence");
  }
  {
    // Appendix F is standard decode only (the CPU decoders refuse skipping with max_draft > 1).
    cuda::ReplayConfig skipping = config;
    skipping.skip_threshold_read = skipping.skip_threshold_flush = 0.25f;
    expect(refusal([&] { cuda::verify_step(kKda, s, 4, d.inputs(), skipping, rec.view, nullptr); }), "skipping");
    skipping.skip_threshold_read = 1.5f;  // thresholds are in [0, 1)
    expect(refusal([&] { cuda::replay_step(kKda, s, d.inputs(), skipping, rec.view, nullptr); }), "skip thresholds");
  }
  CHECK(refusal([&] {
          DeviceArray<float> zero(s.heads() * s.head_elements()), snaps(s.heads() * s.head_elements() * 2);
          cuda::snapshot_verify_step(kKda, s, 2, d.inputs(), zero.ptr, snaps.ptr, nullptr);
        }) != "(no error)");
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
}
