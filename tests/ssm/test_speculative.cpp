// Speculative decoding (Algorithm 2; Algorithm 3 with FP32 copies): verify T drafts, commit a
// random accepted length a in [1, T]; the accepted outputs must equal sequential FP32 decoding
// of the accepted tokens only. Rejected drafts are random garbage; a second run with different
// garbage must give bit-identical outputs (rejected records leave no trace), and the ring buffer
// (instrumented: it throws on overwriting a committed record, and NaN-fills freed slots) must
// never overwrite a committed record.
#include <doctest/doctest.h>

#include <boost/random/uniform_int_distribution.hpp>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "ssm/conventional_decode.h"
#include "ssm/replay_decode.h"
#include "ssm_test_data.h"

using namespace replayssm;
using namespace replayssm::ssm;
using replayssm::test::GroupData;
using replayssm::test::Outputs;
using replayssm::test::compare_close;
using replayssm::test::relative_to_rms;
using replayssm::test::run_error;

namespace {

constexpr int kTokens = 2000;

struct SpecRun {
  Outputs out;
  int max_committed = 0;
  RingStats ring;
  int64_t flushes = 0;
};

// Decodes d by verify/commit (and, with probability 1/5, a plain step) with accepted lengths
// drawn from `seed`; drafts past the accepted length are taken from `garbage`.
SpecRun run_speculative(ReplayDecoderBase& dec, const GroupData& d, const GroupData& garbage, int T, uint64_t seed,
                        bool mix_steps) {
  boost::random::mt19937_64 rng(seed);
  const HeadGroupSequence seq = d.sequence(), junk = garbage.sequence();
  const int G = d.shape.n_value_heads, dv = d.shape.dv;
  SpecRun r;
  r.out = test::make_outputs(d.shape, d.n);
  std::vector<float> o(static_cast<std::size_t>(T) * G * dv);
  int pos = 0;
  while (pos < d.n) {
    if (mix_steps && boost::random::uniform_int_distribution<int>(0, 4)(rng) == 0) {
      dec.step(token_of(seq, pos), o.data());
      for (int g = 0; g < G; ++g)
        std::copy(o.begin() + g * dv, o.begin() + (g + 1) * dv, r.out[g].begin() + static_cast<std::ptrdiff_t>(pos) * dv);
      ++pos;
      continue;
    }
    const int t_eff = std::min(T, d.n - pos);
    const int a = boost::random::uniform_int_distribution<int>(1, t_eff)(rng);
    std::vector<GroupToken> drafts;
    for (int s = 0; s < t_eff; ++s) drafts.push_back(token_of(s < a ? seq : junk, pos + s));
    dec.verify(drafts, o.data());
    dec.commit(a);
    for (int s = 0; s < a; ++s)
      for (int g = 0; g < G; ++g)
        std::copy(o.begin() + (static_cast<std::ptrdiff_t>(s) * G + g) * dv,
                  o.begin() + (static_cast<std::ptrdiff_t>(s) * G + g + 1) * dv,
                  r.out[g].begin() + static_cast<std::ptrdiff_t>(pos + s) * dv);
    pos += a;
    r.max_committed = std::max(r.max_committed, dec.committed());
  }
  r.ring = dec.ring_stats();
  r.flushes = dec.flushes();
  return r;
}

bool all_finite(const Outputs& o) {
  for (const auto& v : o)
    for (float x : v)
      if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace

TEST_CASE("verify + commit(a) equals sequential decoding of the accepted tokens; rejected drafts leave no trace") {
  uint64_t case_seed = test::kBaseSeed * 1000 + 300;
  double worst[3] = {0, 0, 0};  // run error per recurrence
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    const HeadGroupShape shape{kind, 48, 24, 2};
    int regime = 0;
    for (int L : {1, 2, 4, 16, 64}) {
      for (int T : {1, 2, 4, 8}) {
        const bool near_one = (regime++ % 2) == 0;
        const GroupData d = test::make_group_data(shape, kTokens, near_one ? 0.999f : 0.3f, near_one ? 1.0f : 0.7f,
                                                  ++case_seed);
        const GroupData junk1 = test::make_group_data(shape, kTokens, 0.3f, 1.0f, ++case_seed);
        const GroupData junk2 = test::make_group_data(shape, kTokens, 0.3f, 1.0f, ++case_seed);
        ConventionalDecoder conv(shape, PrecisionPolicy{});
        const Outputs ref = test::run_steps(conv, d);
        const uint64_t accept_seed = ++case_seed;
        for (const char* scheme : {"shared:fp32@", "split:fp32/fp32@"}) {
          const PrecisionPolicy p = PrecisionPolicy::parse(scheme + std::to_string(L));
          CAPTURE(to_string(kind));
          CAPTURE(L);
          CAPTURE(T);
          CAPTURE(scheme);
          auto make = [&]() -> std::unique_ptr<ReplayDecoderBase> {
            if (p.scheme == DecodeScheme::split)
              return std::make_unique<SplitPrecisionReplayDecoder>(shape, p, HeadGroupId{}, ReplayDecoderOptions{T});
            return std::make_unique<ReplayDecoder>(shape, p, HeadGroupId{}, ReplayDecoderOptions{T});
          };
          auto dec1 = make(), dec2 = make();
          const bool mix = T > 1;  // interleave plain steps (Algorithm 1/4 after a verify commit)
          SpecRun r1, r2;
          REQUIRE_NOTHROW(r1 = run_speculative(*dec1, d, junk1, T, accept_seed, mix));
          REQUIRE_NOTHROW(r2 = run_speculative(*dec2, d, junk2, T, accept_seed, mix));
          worst[static_cast<int>(kind)] = std::max(worst[static_cast<int>(kind)], run_error(r1.out, ref, shape.dv));
          CHECK_CLOSE(compare_close(r1.out, ref, relative_to_rms(1e-5, ref), "verify/commit vs sequential"));
          CHECK(all_finite(r1.out));      // no NaN-filled dead record was ever read
          CHECK(r1.out == r2.out);        // different rejected garbage, bit-identical outputs
          CHECK(r1.ring.capacity == std::max(L, T) + T);
          CHECK(r1.ring.max_live <= r1.ring.capacity);
          CHECK(r1.max_committed <= std::max(L, T));
          CHECK(r1.ring.records_written == r1.ring.records_flushed + r1.ring.records_rejected + dec1->committed());
          if (T > 1) CHECK(r1.ring.records_rejected > 0);
          CHECK(r1.flushes > 0);
        }
      }
    }
  }
  std::printf("\n[speculative] verify/commit vs sequential FP32 decoding, worst over L, T, schemes:\n");
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    std::printf("  %-6s run error %.2e\n", std::string(to_string(kind)).c_str(), worst[static_cast<int>(kind)]);
  }
}

TEST_CASE("the ring guard fires when the buffer is too small for the flush rule") {
  const HeadGroupShape shape{Recurrence::gdn, 16, 8, 2};
  const GroupData d = test::make_group_data(shape, 64, 0.9f, 1.0f, test::kBaseSeed + 310);
  const HeadGroupSequence seq = d.sequence();
  std::vector<float> o(64 * 16);
  auto run_all_accepted = [&](int L, int T, int capacity) {
    ReplayDecoder dec(shape, PrecisionPolicy::parse("shared:fp32@" + std::to_string(L)), {},
                      {.max_draft = T, .ring_capacity = capacity});
    for (int pos = 0; pos + T <= d.n; pos += T) {
      std::vector<GroupToken> drafts;
      for (int s = 0; s < T; ++s) drafts.push_back(token_of(seq, pos + s));
      dec.verify(drafts, o.data());
      dec.commit(T);
    }
  };
  // Capacity L + T (the default when T <= L) suffices for any accepted lengths; one less does not.
  CHECK_NOTHROW(run_all_accepted(4, 2, 6));
  CHECK_THROWS_AS(run_all_accepted(4, 2, 5), std::logic_error);
  // T > L: after a flush h = a can reach T > L, so the spec's L + T is too small; max(L, T) + T is not.
  CHECK_THROWS_AS(run_all_accepted(1, 4, 5), std::logic_error);
  CHECK_NOTHROW(run_all_accepted(1, 4, 8));
}

TEST_CASE("verify/commit/step misuse is rejected") {
  const HeadGroupShape shape{Recurrence::mamba2, 16, 8, 1};
  const GroupData d = test::make_group_data(shape, 8, 0.9f, 1.0f, test::kBaseSeed + 320);
  const HeadGroupSequence seq = d.sequence();
  ReplayDecoder dec(shape, PrecisionPolicy::parse("shared:fp32@4"), {}, {.max_draft = 2});
  std::vector<float> o(32);
  std::vector<GroupToken> three{token_of(seq, 0), token_of(seq, 1), token_of(seq, 2)};
  CHECK_THROWS_AS(dec.verify(three, o.data()), std::invalid_argument);  // T > max_draft
  CHECK_THROWS_AS(dec.commit(1), std::logic_error);                     // nothing to commit
  std::vector<GroupToken> two{token_of(seq, 0), token_of(seq, 1)};
  dec.verify(two, o.data());
  CHECK_THROWS_AS(dec.step(token_of(seq, 2), o.data()), std::logic_error);  // drafts pending
  CHECK_THROWS_AS(dec.verify(two, o.data()), std::logic_error);
  CHECK_THROWS_AS(dec.commit(3), std::invalid_argument);
  CHECK_THROWS_AS(dec.commit(0), std::invalid_argument);
  dec.commit(1);
  CHECK(dec.committed() == 1);
  CHECK(dec.tokens() == 1);
}

TEST_CASE("split verify (Algorithm 3): the HP checkpoint never sees the LP copy; flush outputs come from HP") {
  // split:nvfp4/fp32 under verify/commit: after every flush the HP checkpoint must equal FP32
  // conventional decoding of the committed tokens (GDN/KDA: u^HP recomputed from the raw inputs),
  // and the outputs of flush calls (read from HP) must be FP32-accurate, while non-flush outputs
  // carry one NVFP4 rounding. A shared NVFP4 checkpoint, for contrast, drifts.
  uint64_t case_seed = test::kBaseSeed * 1000 + 330;
  std::printf("\n[split verify] vs FP32 conventional (max relative, Frobenius / per token)\n");
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    const HeadGroupShape shape{kind, 48, 24, 2};
    const int T = 4, n = 1500, G = shape.n_value_heads, dv = shape.dv;
    const GroupData d = test::make_group_data(shape, n, 0.995f, 1.0f, ++case_seed);
    const HeadGroupSequence seq = d.sequence();
    // FP32 reference outputs and states after every token.
    ConventionalDecoder conv(shape, PrecisionPolicy{});
    std::vector<std::vector<StateMatrix>> states(static_cast<std::size_t>(n + 1));
    states[0].assign(static_cast<std::size_t>(G), StateMatrix::Zero(dv, shape.dk));
    Outputs ref = test::make_outputs(shape, n);
    std::vector<float> o(static_cast<std::size_t>(T) * G * dv), o_shared(o.size());
    for (int t = 0; t < n; ++t) {
      conv.step(token_of(seq, t), o.data());
      for (int g = 0; g < G; ++g) {
        std::copy(o.begin() + g * dv, o.begin() + (g + 1) * dv, ref[g].begin() + static_cast<std::ptrdiff_t>(t) * dv);
        states[static_cast<std::size_t>(t + 1)].push_back(conv.state(g));
      }
    }
    SplitPrecisionReplayDecoder split(shape, PrecisionPolicy::parse("split:nvfp4+rtn/fp32@16"), {}, {.max_draft = T});
    ReplayDecoder shared(shape, PrecisionPolicy::parse("shared:nvfp4+rtn@16"), {}, {.max_draft = T});
    boost::random::mt19937_64 rng(++case_seed);
    int pos = 0;
    double worst_ckpt = 0, worst_flush_out = 0, worst_lp_out = 0, shared_ckpt = 0;
    while (pos + T <= n) {
      const int a = boost::random::uniform_int_distribution<int>(1, T)(rng);
      std::vector<GroupToken> drafts;
      for (int s = 0; s < T; ++s) drafts.push_back(token_of(seq, pos + s));
      const int64_t flushes_before = split.flushes();
      split.verify(drafts, o.data());
      shared.verify(drafts, o_shared.data());
      const bool flushed = split.flushes() > flushes_before;
      for (int s = 0; s < T; ++s)
        for (int g = 0; g < G; ++g) {
          Eigen::Map<const Eigen::VectorXf> got(&o[(static_cast<std::size_t>(s) * G + g) * dv], dv);
          Eigen::Map<const Eigen::VectorXf> want(&ref[g][static_cast<std::size_t>(pos + s) * dv], dv);
          double& worst = flushed ? worst_flush_out : worst_lp_out;
          worst = std::max(worst, double((got - want).norm() / want.norm()));
        }
      if (flushed) {  // the fold covered exactly the committed tokens [0, pos)
        for (int g = 0; g < G; ++g) {
          const StateMatrix& want = states[static_cast<std::size_t>(pos)][static_cast<std::size_t>(g)];
          worst_ckpt = std::max(worst_ckpt, double((split.recur_checkpoint(g) - want).norm() / want.norm()));
          if (shared.flushes() > 0)
            shared_ckpt = std::max(shared_ckpt, double((shared.checkpoint(g) - want).norm() / want.norm()));
        }
      }
      split.commit(a);
      shared.commit(a);
      pos += a;
    }
    std::printf("  %-6s split: HP checkpoint %.2e, flush-call outputs %.2e, non-flush (NVFP4 read) outputs %.2e; "
                "shared NVFP4 checkpoint %.2e\n",
                std::string(to_string(kind)).c_str(), worst_ckpt, worst_flush_out, worst_lp_out, shared_ckpt);
    CAPTURE(to_string(kind));
    CHECK(split.flushes() > 10);
    CHECK(worst_ckpt == 0.0);  // structural: the HP fold recomputes u^HP exactly as conventional steps do
    CHECK(worst_flush_out <= 1e-4);  // pure per-token relative error of FP32-accurate outputs
    CHECK(worst_lp_out > 1e-3);      // the LP read is really used by non-flush calls
    CHECK(shared_ckpt > 1e-2);
  }
}
