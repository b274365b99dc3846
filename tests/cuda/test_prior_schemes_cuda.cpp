// The prior speculative state-recovery schemes (cuda/ssm/prior_schemes.h, paper appendix A) against
// the CPU sequential decode (ssm::ConventionalDecoder, FP32): rounds of verify + verdict + recovery
// with random accepted lengths per sequence, fresh random inputs every round (recorded seeds), the
// draft outputs compared with the conventional decoder run through the drafts, and the committed
// state with the decoder's state after the accepted tokens, every round. FP32 throughout:
// |gpu - cpu| <= 1e-5 (rms + |cpu|) (test_util.h). Also: the full-state traffic the launchers derive
// equals the paper's table (ssm::prior_speculative_schemes), and bad input is refused by name.
// Skips (exit 77) without a CUDA device.
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
#include "ssm/analytic_model.h"
#include "ssm/conventional_decode.h"
#include "ssm/prior_schemes.h"
#include "test_util.h"

using namespace replayssm;
using cuda::DecodeShape;
using cuda::PriorScheme;

namespace {

using test::DeviceArray;

const test::GpuGuard gpu_guard("prior speculative scheme kernel tests");


// T draft tokens for the batch; host floats are exactly the bf16 values the GPU reads.
struct HostDrafts {
  int T = 1;
  std::vector<__nv_bfloat16> q, k, v;  // [B][T][G][dk], [B][T][H][dv]
  std::vector<float> qf, kf, vf, alpha, beta;
};

HostDrafts make_drafts(boost::random::mt19937_64& rng, ssm::Recurrence kind, const DecodeShape& s, int T, bool slow_decay) {
  boost::random::normal_distribution<float> normal(0.0f, 1.0f);
  boost::random::uniform_real_distribution<float> unit(0.0f, 1.0f);
  HostDrafts d;
  d.T = T;
  const std::size_t nk = static_cast<std::size_t>(s.batch) * T * s.key_heads * s.dk;
  const std::size_t nv = static_cast<std::size_t>(s.batch) * T * s.value_heads * s.dv;
  d.q.resize(nk), d.k.resize(nk), d.v.resize(nv), d.qf.resize(nk), d.kf.resize(nk), d.vf.resize(nv);
  for (std::size_t base = 0; base < nk; base += s.dk) {
    // GDN keys and queries L2-normalised (Qwen3.5); Mamba-2 B/C are not.
    std::vector<float> q(s.dk), k(s.dk);
    float nq = 0, nkk = 0;
    for (int c = 0; c < s.dk; ++c) q[c] = normal(rng), k[c] = normal(rng), nq += q[c] * q[c], nkk += k[c] * k[c];
    for (int c = 0; c < s.dk; ++c) {
      const float qq = kind == ssm::Recurrence::gdn ? q[c] / std::sqrt(nq) : 0.1f * q[c];
      const float kk = kind == ssm::Recurrence::gdn ? k[c] / std::sqrt(nkk) : 0.1f * k[c];
      d.q[base + c] = __float2bfloat16(qq), d.k[base + c] = __float2bfloat16(kk);
      d.qf[base + c] = __bfloat162float(d.q[base + c]), d.kf[base + c] = __bfloat162float(d.k[base + c]);
    }
  }
  for (std::size_t i = 0; i < nv; ++i) d.v[i] = __float2bfloat16(normal(rng)), d.vf[i] = __bfloat162float(d.v[i]);
  const std::size_t nh = static_cast<std::size_t>(s.batch) * T * s.value_heads;
  d.alpha.resize(nh), d.beta.resize(nh);
  for (std::size_t i = 0; i < nh; ++i) {
    d.alpha[i] = slow_decay ? 0.999f + 0.001f * unit(rng) : 0.3f + 0.5f * unit(rng);
    d.beta[i] = 0.05f + 0.9f * unit(rng);
  }
  return d;
}

struct DeviceDrafts {
  DeviceArray<__nv_bfloat16> q, k, v;
  DeviceArray<float> alpha, beta, out;
  DeviceDrafts(const HostDrafts& h, std::size_t out_elems)
      : q(h.q.size()), k(h.k.size()), v(h.v.size()), alpha(h.alpha.size()), beta(h.beta.size()), out(out_elems) {
    q.upload(h.q), k.upload(h.k), v.upload(h.v), alpha.upload(h.alpha), beta.upload(h.beta);
    out.upload(std::vector<float>(out_elems, std::numeric_limits<float>::quiet_NaN()));  // unwritten outputs fail
  }
  cuda::StepInputs inputs() { return {q.ptr, k.ptr, v.ptr, alpha.ptr, beta.ptr, out.ptr}; }
};

ssm::GroupToken group_token(const HostDrafts& h, const DecodeShape& s, int b, int g, int t) {
  ssm::GroupToken x;
  const std::size_t kh = (static_cast<std::size_t>(b) * h.T + t) * s.key_heads + g;
  x.q = &h.qf[kh * s.dk];
  x.k = &h.kf[kh * s.dk];
  for (int j = 0; j < s.heads_per_group(); ++j) {
    const std::size_t vh = (static_cast<std::size_t>(b) * h.T + t) * s.value_heads + g * s.heads_per_group() + j;
    x.alpha.push_back(&h.alpha[vh]);
    x.beta.push_back(h.beta[vh]);
    x.v.push_back(&h.vf[vh * s.dv]);
  }
  return x;
}

// The device buffers of one scheme: its full states (zero: the decoders' initial state) and the
// two draft caches.
struct SchemeBuffers {
  std::vector<std::unique_ptr<DeviceArray<float>>> states;
  std::vector<std::unique_ptr<DeviceArray<__nv_bfloat16>>> bf;
  std::vector<std::unique_ptr<DeviceArray<float>>> f32;
  cuda::PriorBuffers view;
  SchemeBuffers(PriorScheme scheme, const DecodeShape& s, int T) {
    view.drafts = T;
    for (int i = 0; i < cuda::prior_state_buffers(scheme); ++i) {
      states.push_back(std::make_unique<DeviceArray<float>>(s.heads() * s.head_elements()));
      view.state[i] = states.back()->ptr;
    }
    for (auto& c : view.cache) {
      bf.push_back(std::make_unique<DeviceArray<__nv_bfloat16>>(static_cast<std::size_t>(s.batch) * T * s.key_heads * s.dk));
      c.k = bf.back()->ptr;
      bf.push_back(std::make_unique<DeviceArray<__nv_bfloat16>>(static_cast<std::size_t>(s.batch) * T * s.value_heads * s.dv));
      c.v = bf.back()->ptr;
      f32.push_back(std::make_unique<DeviceArray<float>>(static_cast<std::size_t>(s.batch) * T * s.value_heads));
      c.alpha = f32.back()->ptr;
      f32.push_back(std::make_unique<DeviceArray<float>>(static_cast<std::size_t>(s.batch) * T * s.value_heads));
      c.beta = f32.back()->ptr;
    }
  }
};

// Where an element came from (round, sequence, draft or value head, the verdicts), so that a failure
// names the worst element's accepted lengths.
struct Tag {
  int round, b, index, a, prev_a;
};

struct Collected {
  std::vector<double> gpu, cpu;
  std::vector<Tag> tags;
  void add(const float* g, const float* ref, std::size_t n, Tag tag) {
    gpu.insert(gpu.end(), g, g + n);
    cpu.insert(cpu.end(), ref, ref + n);
    tags.insert(tags.end(), n, tag);
  }
  test::Closeness close(double tol, const std::string& what) const {
    return test::compare_close(gpu, cpu, {tol * test::rms(cpu.data(), cpu.size()), tol}, what);
  }
  // The element with the largest |gpu - cpu| / (tol (rms + |cpu|)) (NaN first), described.
  std::string worst(double tol, const char* index_name) const {
    const double rms = test::rms(cpu.data(), cpu.size());
    std::size_t at = 0;
    double worst = -1.0;
    for (std::size_t i = 0; i < gpu.size(); ++i) {
      const double e = std::abs(gpu[i] - cpu[i]) / (tol * (rms + std::abs(cpu[i])));
      const double x = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      if (x > worst) worst = x, at = i;
    }
    if (gpu.empty()) return "nothing compared";
    const Tag& t = tags[at];
    return "worst element: round " + std::to_string(t.round) + ", sequence " + std::to_string(t.b) + ", " + index_name + " " +
           std::to_string(t.index) + ", a = " + std::to_string(t.a) + ", previous a = " + std::to_string(t.prev_a) +
           ": gpu " + std::to_string(gpu[at]) + ", cpu " + std::to_string(cpu[at]) + ", " + std::to_string(worst) + " x allowed";
  }
};

struct Case {
  ssm::Recurrence kind;
  DecodeShape shape;  // batch, key heads, value heads, dk, dv
  bool slow_decay;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  for (ssm::Recurrence k : {ssm::Recurrence::mamba2, ssm::Recurrence::gdn}) {
    c.push_back({k, {2, 1, 16, 128, 64}, true});   // Nemotron-3-Super head group (16 value heads per key head), decays near 1
    c.push_back({k, {3, 2, 6, 64, 80}, false});    // dk 64, dv 80 (Nano's dv), GQA 3, odd batch
    c.push_back({k, {2, 4, 4, 128, 80}, false});   // one value head per key head
    c.push_back({k, {2, 2, 4, 64, 37}, true});     // awkward dv
    c.push_back({k, {1, 2, 4, 256, 24}, false});   // dk 256
  }
  return c;
}

std::string describe(PriorScheme p, const Case& c, int T) {
  const DecodeShape& s = c.shape;
  return std::string(cuda::scheme_key(p)) + " " + std::string(ssm::to_string(c.kind)) + " T=" + std::to_string(T) +
         " B=" + std::to_string(s.batch) + " G=" + std::to_string(s.key_heads) + " H=" + std::to_string(s.value_heads) +
         " dk=" + std::to_string(s.dk) + " dv=" + std::to_string(s.dv) + (c.slow_decay ? " slow decay" : "");
}

}  // namespace

TEST_CASE("prior-scheme full-state traffic derived from the launch plans equals the paper's table") {
  for (int T : {1, 2, 4, 8}) {
    const auto table = ssm::prior_speculative_schemes(T);
    for (PriorScheme p : cuda::kPriorSchemes) {
      const auto row = std::find_if(table.begin(), table.end(), [&](const auto& r) { return r.name == cuda::to_string(p); });
      REQUIRE_MESSAGE(row != table.end(), cuda::to_string(p));
      const auto t = cuda::prior_scheme_traffic(p);
      INFO(cuda::to_string(p) << ": derived " << t.state_reads << "R + " << t.state_writes << "W, table " << row->state_reads
                              << "R + " << row->state_writes << "W");
      CHECK(t.state_reads == row->state_reads);
      CHECK(t.state_writes == row->state_writes);
      int r = 0, w = 0;
      for (const auto& l : cuda::prior_scheme_launches(p)) r += l.state_reads, w += l.state_writes;
      CHECK(r == t.state_reads);
      CHECK(w == t.state_writes);
    }
    // The Mamba in the Llama: a serial chain of at most 2T - 1 steps (a = T - 1), T at a = T.
    int longest = 0;
    for (int a = 1; a <= T; ++a) longest = std::max(longest, cuda::prior_scheme_chain_steps(PriorScheme::mamba_in_llama, T, a));
    CHECK(longest == std::max(2 * T - 1, T));
    CHECK(cuda::prior_scheme_chain_steps(PriorScheme::stree, T, 1) == T);  // masked: the same chain for every a
  }
  CHECK(cuda::prior_scheme_launches(PriorScheme::activation_replay).size() == 3);  // recompute, copy, verify
  CHECK(cuda::prior_scheme_launches(PriorScheme::mamba_in_llama).size() == 1);     // one fused launch
}

TEST_CASE("prior-scheme kernels equal the CPU sequential decode: draft outputs and committed states, random accepted lengths") {
  boost::random::mt19937_64 accept_rng(test::kBaseSeed + 61000);
  int n = 0;
  for (const Case& c : cases()) {
    for (int T : {1, 2, 4, 8}) {
      for (PriorScheme p : cuda::kPriorSchemes) {
        const DecodeShape& s = c.shape;
        const int hpg = s.heads_per_group();
        const ssm::HeadGroupShape group{c.kind, s.dk, s.dv, hpg};
        const auto policy = ssm::PrecisionPolicy::parse("conv:fp32");
        std::vector<ssm::ConventionalDecoder> committed;  // per (b, g): the state after every accepted token
        for (int b = 0; b < s.batch; ++b)
          for (int g = 0; g < s.key_heads; ++g)
            committed.emplace_back(group, policy, ssm::HeadGroupId{static_cast<uint32_t>(b), static_cast<uint32_t>(g)});
        SchemeBuffers buf(p, s, T);
        DeviceArray<int> prev(s.batch), acc_dev(s.batch);  // prev: zeros before the first verdict
        boost::random::mt19937_64 rng(test::kBaseSeed + 60000 + n);
        Collected outputs, states;
        int a_one = 0, a_full = 0;
        std::vector<int> acc_prev(s.batch, 0), acc_now(s.batch, 0);
        int round = 0;
        auto compare_state = [&] {
          std::vector<float> gpu(s.heads() * s.head_elements());
          REPLAYSSM_CUDA_CHECK(cudaMemcpy(gpu.data(), cuda::prior_committed_state(p, buf.view), gpu.size() * sizeof(float),
                                          cudaMemcpyDeviceToHost));
          for (int b = 0; b < s.batch; ++b)
            for (int g = 0; g < s.key_heads; ++g)
              for (int j = 0; j < hpg; ++j) {
                const auto& S = committed[b * s.key_heads + g].state(j);  // row-major dv x dk
                const std::size_t head = static_cast<std::size_t>(b) * s.value_heads + g * hpg + j;
                // The verdicts the committed state holds: this round's, or the previous one's (lagging).
                const bool lag = cuda::prior_recovery_lags(p);
                states.add(gpu.data() + head * s.head_elements(), S.data(), s.head_elements(),
                           {round, b, g * hpg + j, lag ? acc_prev[b] : acc_now[b], lag ? 0 : acc_prev[b]});
              }
        };
        const int rounds = 10;
        for (round = 0; round < rounds; ++round) {
          const HostDrafts h = make_drafts(rng, c.kind, s, T, c.slow_decay);
          DeviceDrafts d(h, s.heads() * s.dv * T);
          cuda::prior_verify_step(p, c.kind, s, d.inputs(), prev.ptr, buf.view, nullptr);
          REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
          // Lagging schemes have just recovered the previous verdict: their committed state is the
          // decoder's now (before this round's tokens).
          if (cuda::prior_recovery_lags(p) && round > 0) compare_state();
          const auto out = d.out.download();
          std::vector<int> acc(s.batch);
          for (int b = 0; b < s.batch; ++b) {
            // A third each: a = 1, a = T, uniform in [1, T].
            const int pick = boost::random::uniform_int_distribution<int>(0, 2)(accept_rng);
            acc[b] = pick == 0 ? 1 : pick == 1 ? T : boost::random::uniform_int_distribution<int>(1, T)(accept_rng);
            a_one += acc[b] == 1, a_full += acc[b] == T;
          }
          acc_dev.upload(acc);
          acc_now = acc;
          cuda::prior_recover_step(p, c.kind, s, acc_dev.ptr, buf.view, nullptr);
          REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
          prev.upload(acc);
          for (int b = 0; b < s.batch; ++b)
            for (int g = 0; g < s.key_heads; ++g) {
              ssm::ConventionalDecoder& dec = committed[b * s.key_heads + g];
              ssm::ConventionalDecoder fork = dec;  // runs through all T drafts: the verify outputs
              std::vector<float> ref(static_cast<std::size_t>(hpg) * s.dv);
              for (int t = 0; t < T; ++t) {
                fork.step(group_token(h, s, b, g, t), ref.data());
                const std::size_t off = ((static_cast<std::size_t>(b) * T + t) * s.value_heads + g * hpg) * s.dv;
                outputs.add(out.data() + off, ref.data(), ref.size(), {round, b, t, acc[b], acc_prev[b]});
              }
              for (int t = 0; t < acc[b]; ++t) dec.step(group_token(h, s, b, g, t), ref.data());  // commit a
            }
          if (!cuda::prior_recovery_lags(p)) compare_state();
          acc_prev = acc;
        }
        const std::string what = describe(p, c, T);
        const auto close_out = outputs.close(1e-5, what + ": draft outputs vs CPU conventional decode");
        const auto close_state = states.close(1e-5, what + ": committed state vs CPU conventional decode");
        std::printf("%-60s %d rounds (a = 1: %d, a = T: %d): max |d|/allowed outputs %.2f, states %.2f (tol 1e-5)\n",
                    what.c_str(), rounds, a_one, a_full, close_out.max_excess, close_state.max_excess);
        if (!close_out.ok()) MESSAGE(what << " draft outputs, " << outputs.worst(1e-5, "draft"));
        if (!close_state.ok()) MESSAGE(what << " committed state, " << states.worst(1e-5, "value head"));
        CHECK_CLOSE(close_out);
        CHECK_CLOSE(close_state);
        ++n;
      }
    }
  }
}

TEST_CASE("prior-scheme launchers refuse bad input, naming the field") {
  const DecodeShape s{2, 1, 4, 128, 64};
  const int T = 4;
  boost::random::mt19937_64 rng(test::kBaseSeed + 62000);
  const HostDrafts h = make_drafts(rng, ssm::Recurrence::mamba2, s, T, false);
  DeviceDrafts d(h, s.heads() * s.dv * T);
  DeviceArray<int> acc(s.batch);
  auto err = [](auto&& f) { return test::error_of<std::invalid_argument>(f); };
  {
    SchemeBuffers buf(PriorScheme::joint_attainment, s, T);
    buf.view.state[2] = nullptr;
    const std::string e = err([&] {
      cuda::prior_verify_step(PriorScheme::joint_attainment, ssm::Recurrence::mamba2, s, d.inputs(), acc.ptr, buf.view, nullptr);
    });
    INFO(e);
    CHECK(test::contains(e, "state[i]"));
    CHECK(test::contains(e, "i = 2"));
  }
  {
    SchemeBuffers buf(PriorScheme::stree, s, T);
    buf.view.drafts = 16;
    const std::string e = err([&] {
      cuda::prior_verify_step(PriorScheme::stree, ssm::Recurrence::mamba2, s, d.inputs(), nullptr, buf.view, nullptr);
    });
    INFO(e);
    CHECK(test::contains(e, "T = 16"));
  }
  {
    SchemeBuffers buf(PriorScheme::mamba_in_llama, s, T);
    const std::string e = err([&] {
      cuda::prior_verify_step(PriorScheme::mamba_in_llama, ssm::Recurrence::mamba2, s, d.inputs(), nullptr, buf.view, nullptr);
    });
    INFO(e);
    CHECK(test::contains(e, "prev_accepted"));
    const std::string r = err([&] {
      cuda::prior_recover_step(PriorScheme::activation_replay, ssm::Recurrence::mamba2, s, nullptr, buf.view, nullptr);
    });
    INFO(r);
    CHECK(test::contains(r, "accepted"));
  }
  {
    SchemeBuffers buf(PriorScheme::stree, s, T);
    buf.view.cache[1].beta = nullptr;  // GDN needs the betas
    const std::string e = err([&] {
      cuda::prior_verify_step(PriorScheme::stree, ssm::Recurrence::gdn, s, d.inputs(), nullptr, buf.view, nullptr);
    });
    INFO(e);
    CHECK(test::contains(e, "cache[c]"));
    CHECK(test::contains(e, "c = 1"));
    const std::string k = err([&] {
      cuda::prior_verify_step(PriorScheme::stree, ssm::Recurrence::kda, s, d.inputs(), nullptr, buf.view, nullptr);
    });
    INFO(k);
    CHECK(test::contains(k, "kda"));
    const DecodeShape bad{2, 1, 4, 96, 64};
    const std::string sh = err([&] {
      cuda::prior_verify_step(PriorScheme::stree, ssm::Recurrence::mamba2, bad, d.inputs(), nullptr, buf.view, nullptr);
    });
    INFO(sh);
    CHECK(test::contains(sh, "dk = 96"));
  }
  CHECK_THROWS_AS(cuda::prior_scheme_chain_steps(PriorScheme::stree, 4, 5), std::invalid_argument);  // a > T
  CHECK_THROWS_AS(cuda::prior_scheme_chain_steps(PriorScheme::stree, 0, 1), std::invalid_argument);  // T < 1
}
