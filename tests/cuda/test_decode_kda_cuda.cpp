// CUDA KDA (Kimi Delta Attention, channel-wise decay) decode kernels against the CPU literal decoders
// (ssm::ConventionalDecoder, ssm::ReplayDecoder, ssm::SplitPrecisionReplayDecoder with kda head-group
// shapes), on fresh random inputs from fixed recorded seeds (test::kBaseSeed + offset): conventional
// steps (fp32, fp16, bf16 state), ReplaySSM standard decode with staggered windows (shared fp32, split
// fp16/bf16/fp8b128/nvfp4 reads, fp32 or fp16+SR recurrence), verification of T in {1, 2, 4, 8} drafts
// with random accepted lengths, and standard steps after commits that leave h >= L. Decays per channel
// near 1, far from 1, or mixed (KDA heads keep a few long channels among fast ones). Outputs are
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
#include <cuda_bf16.h>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "gpu_test_util.h"
#include "decode_test_util.h"
#include "ssm/decode_kernels.h"
#include "ssm/replay_decode.h"
#include "test_util.h"

using namespace replayssm;
using cuda::DecodeShape;
using formats::StorageFormat;

namespace {

using test::check_with_flips;
using test::Collected;
using test::DeviceArray;
using test::ReadCopyHost;
using test::RecordBuffers;  // built with decay width dk: the KDA records' alpha
using test::StateBuffers;

const test::GpuGuard gpu_guard("KDA decode kernel tests");

constexpr ssm::Recurrence kKda = ssm::Recurrence::kda;


enum class Decays { slow, fast, mixed };
const char* to_string(Decays d) { return d == Decays::slow ? "slow" : d == Decays::fast ? "fast" : "mixed"; }

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
    for (float& a : st.alpha) {
      const bool slow = decays == Decays::slow || (decays == Decays::mixed && unit(rng) < 0.25f);
      a = slow ? 0.999f + 0.001f * unit(rng) : 0.3f + 0.5f * unit(rng);
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

// Output offset of (sequence b, token t of T, key head g's first value head) in [B][T][H][dv].
std::size_t out_offset(const DecodeShape& s, int b, int T, int t, int g) {
  return ((static_cast<std::size_t>(b) * T + t) * s.value_heads + static_cast<std::size_t>(g) * s.heads_per_group()) * s.dv;
}

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
                                     ref.begin() + static_cast<std::ptrdiff_t>((t + 1) * per_token)));
    }
}

// One standard step on the GPU and the CPU decoders; the outputs into meter.
template <class Decoder>
void standard_step(const Case& c, const HostStep& h, cuda::ReplayConfig& config, RecordBuffers& rec,
                   std::vector<std::unique_ptr<Decoder>>& cpu, Collected& meter) {
  const DecodeShape& s = c.shape;
  DeviceStep d(h, s.heads() * s.dv);
  cuda::replay_step(kKda, s, d.inputs(), config, rec.view, nullptr);
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

TEST_CASE("KDA conventional decode kernels equal the CPU conventional decoder (fp32; fp16/bf16 state)") {
  int n = 0;
  for (const Case& c : cases()) {
    for (StorageFormat f : {StorageFormat::fp32, StorageFormat::fp16, StorageFormat::bf16}) {
      const DecodeShape& s = c.shape;
      const char* policy_text = f == StorageFormat::fp32 ? "conv:fp32" : f == StorageFormat::fp16 ? "conv:fp16+rtn" : "conv:bf16+rtn";
      const auto policy = ssm::PrecisionPolicy::parse(policy_text);
      std::vector<std::unique_ptr<ssm::HeadGroupDecoder>> cpu;
      for (int b = 0; b < s.batch; ++b)
        for (int g = 0; g < s.key_heads; ++g)
          cpu.push_back(ssm::make_decoder(group_shape(s), policy, {static_cast<uint32_t>(b), static_cast<uint32_t>(g)}));
      StateBuffers state(f, s);
      const uint64_t seed = test::kBaseSeed + 57000 + n;
      InputGen gen(seed, c.decays);
      Collected meter;
      for (int step = 0; step < 48; ++step) {
        const HostStep h = gen.make(s, 1);
        DeviceStep d(h, s.heads() * s.dv);
        cuda::conventional_step(kKda, s, d.inputs(), state.view, nullptr);
        REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
        const auto out = d.out.download();
        for (int b = 0; b < s.batch; ++b)
          for (int g = 0; g < s.key_heads; ++g) {
            std::vector<float> ref(static_cast<std::size_t>(s.heads_per_group()) * s.dv);
            cpu[static_cast<std::size_t>(b) * s.key_heads + g]->step(group_token(h, s, b, g, 0), ref.data());
            meter.add(out, out_offset(s, b, 1, 0, g), ref);
          }
      }
      const double tol = f == StorageFormat::fp32 ? 1e-5 : f == StorageFormat::fp16 ? 2e-3 : 2e-2;
      const std::string what = "kda conventional " + std::string(policy_text) + " " + describe(c) + ", seed " + std::to_string(seed);
      const auto close = meter.close(tol, what);
      std::printf("%s: max |d|/allowed %.2f (tol %.0e), %zu mismatches of %zu\n", what.c_str(), close.max_excess, tol,
                  close.mismatches, close.count);
      INFO(what);
      if (f == StorageFormat::fp32)
        CHECK_CLOSE(close);
      else
        check_with_flips(meter, close, what);
      ++n;
    }
  }
}

TEST_CASE("KDA ReplaySSM decode kernels equal the CPU decoders: shared fp32 and split low-precision reads, staggered windows") {
  int n = 0;
  for (const Case& c : cases()) {
    for (const char* policy_text : {"shared:fp32@1", "shared:fp32@4", "shared:fp32@16", "shared:fp32@64", "split:fp16/fp32@8",
                                    "split:bf16/fp32@8", "split:fp8b128/fp32@16", "split:nvfp4/fp32@16",
                                    "split:nvfp4/fp32@33", "split:fp8b128/fp16+sr@4"}) {
      const DecodeShape& s = c.shape;
      const auto policy = ssm::PrecisionPolicy::parse(policy_text);
      if (policy.read.format == StorageFormat::fp8b128 && s.dk % 128) continue;
      const int L = policy.window;
      const bool split = policy.scheme == ssm::DecodeScheme::split;
      // Sequence b starts at window position b % L (neutral records on both sides), so flush and
      // non-flush blocks share launches.
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
      StateBuffers recur_buf(policy.recur.format, s);
      std::unique_ptr<StateBuffers> read_buf;
      cuda::ReplayConfig config;
      config.window = L;
      config.recur = recur_buf.view;
      config.recur_rounding = policy.recur.rounding;
      config.seed = policy.seed;
      if (split) {
        read_buf = std::make_unique<StateBuffers>(policy.read.format, s);
        config.read = read_buf->view;
      }
      RecordBuffers rec(s, L, initial, s.dk);
      const uint64_t seed = test::kBaseSeed + 59000 + n;
      InputGen gen(seed, c.decays);
      Collected meter;
      int read_checks = 0, read_mismatch = 0, first_bad_step = -1;
      for (int step = 0; step < 3 * L + 5; ++step) {
        const HostStep h = gen.make(s, 1);
        standard_step(c, h, config, rec, cpu, meter);
        // After a flush of sequence b its LP copy must equal quantize(own fp32 recur) bit for bit.
        if (split && policy.recur.format == StorageFormat::fp32) {
          std::vector<float> recur_host(s.heads() * s.head_elements());
          REPLAYSSM_CUDA_CHECK(cudaMemcpy(recur_host.data(), recur_buf.payload.ptr, recur_host.size() * 4, cudaMemcpyDeviceToHost));
          const ReadCopyHost read_copy(*read_buf);
          for (int b = 0; b < s.batch; ++b) {
            if ((b % L + step + 1) % L != 0) continue;  // not flushed at this step
            for (int hd = 0; hd < s.value_heads; ++hd) {
              const std::size_t head = static_cast<std::size_t>(b) * s.value_heads + hd;
              const bool same = read_copy.equals_quantized(&recur_host[head * s.head_elements()], s.dv, s.dk, head);
              ++read_checks;
              if (!same && first_bad_step < 0) first_bad_step = step;
              read_mismatch += !same;
            }
          }
        }
      }
      const double tol = !split ? 1e-5 : policy.recur.format == StorageFormat::fp32 ? 5e-3 : 2e-2;
      const std::string what = "kda replay " + std::string(policy_text) + " " + describe(c) + ", seed " + std::to_string(seed);
      const auto close = meter.close(tol, what);
      std::printf("%s: max |d|/allowed %.2f (tol %.0e), %zu mismatches of %zu%s\n", what.c_str(), close.max_excess, tol,
                  close.mismatches, close.count,
                  read_checks ? (", read (LP) checkpoints bit-equal: " + std::to_string(read_checks - read_mismatch) + "/" +
                                 std::to_string(read_checks) +
                                 (first_bad_step >= 0 ? " (first mismatch at step " + std::to_string(first_bad_step) + ")" : ""))
                                    .c_str()
                              : "");
      INFO(what);
      if (!split)
        CHECK_CLOSE(close);
      else
        check_with_flips(meter, close, what);
      CHECK(read_mismatch == 0);
      ++n;
    }
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
                                 {"split:bf16/fp32@16", 2}, {"shared:fp16+sr@16", 8}};
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
      StateBuffers recur_buf(policy.recur.format, s);
      std::unique_ptr<StateBuffers> read_buf;
      cuda::ReplayConfig config;
      config.window = L;
      config.recur = recur_buf.view;
      config.recur_rounding = policy.recur.rounding;
      config.seed = policy.seed;
      if (split) {
        read_buf = std::make_unique<StateBuffers>(policy.read.format, s);
        config.read = read_buf->view;
      }
      RecordBuffers rec(s, std::max(L, T) + T, std::vector<cuda::WindowState>(s.batch), s.dk);
      rec.view.max_drafts = T;
      DeviceArray<int> accepted(s.batch);
      const uint64_t seed = test::kBaseSeed + 66000 + n;
      InputGen gen(seed, c.decays);
      Collected meter;
      int lp_verifies = 0, folding_verifies = 0;
      const std::size_t per_token = static_cast<std::size_t>(s.heads_per_group()) * s.dv;
      for (int round = 0; round < 12; ++round) {
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
                                             ref.begin() + static_cast<std::ptrdiff_t>((t + 1) * per_token)));
            }
        }
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
              if (!split || dec.flushes() == 0) continue;
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
      check_with_flips(meter, close, what);
      if (!states.gpu.empty()) CHECK_CLOSE(states.close(1e-5, what + " FP32 HP checkpoints"));
      CHECK(read_mismatch == 0);
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
          for (int b = 0; b < s.batch; ++b) long_flushes += cpu[static_cast<std::size_t>(b) * s.key_heads]->committed() >= L;
          standard_step(c, gen.make(s, 1), config, rec, cpu, meter);
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
  CHECK(refusal([&] {
          DeviceArray<float> zero(s.heads() * s.head_elements()), snaps(s.heads() * s.head_elements() * 2);
          cuda::snapshot_verify_step(kKda, s, 2, d.inputs(), zero.ptr, snaps.ptr, nullptr);
        }) != "(no error)");
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
}
