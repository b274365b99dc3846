// Appendix F, decay-based checkpoint-read skipping (',skip=auto|T', precision_policy.h) in the
// sequence emulator, against an independent float64 oracle: every output is the float64 replay of
// the window so far from the checkpoint the step reads, or from zero where gamma_h (a float32
// running product from the window's start; KDA: its largest channel) is below the threshold of
// that copy; every checkpoint is one rounding of the float64 replay of its window from the
// previous checkpoint (zero for a pure-write flush). The grammar, the thresholds `auto` derives
// and the refusals of the paths that do not implement skipping are checked too.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "formats/quantized_matrix.h"
#include "ssm/precision_policy.h"
#include "ssm/replay_decode.h"
#include "ssm/sequence_emulator.h"
#include "ssm/state_error.h"
#include "ssm_test_data.h"

using namespace replayssm;
using namespace replayssm::ssm;
using formats::StorageFormat;

namespace {

// One step of the recurrence in float64, in its literal (delta-rule) form, as oracle_outputs does.
void step64(Recurrence kind, std::vector<double>& S, int dk, int dv, const float* a, double b, const float* v,
            const float* k) {
  std::vector<double> Sk(static_cast<std::size_t>(dv), 0.0);
  if (kind == Recurrence::kda)
    for (int i = 0; i < dv; ++i)
      for (int c = 0; c < dk; ++c) S[i * dk + c] *= a[c];
  if (kind != Recurrence::mamba2)
    for (int i = 0; i < dv; ++i)
      for (int c = 0; c < dk; ++c) Sk[i] += S[i * dk + c] * k[c];
  for (int i = 0; i < dv; ++i)
    for (int c = 0; c < dk; ++c) {
      double& s = S[i * dk + c];
      switch (kind) {
        case Recurrence::mamba2: s = a[0] * s + double(v[i]) * k[c]; break;
        case Recurrence::gdn: s = a[0] * (s - b * Sk[i] * k[c]) + b * double(v[i]) * k[c]; break;
        case Recurrence::kda: s += -b * Sk[i] * k[c] + b * double(v[i]) * k[c]; break;
      }
    }
}

struct Checkpoints {
  std::vector<float> recur, read;
};

}  // namespace

TEST_CASE("skip grammar: auto or a threshold in (0, 1), shared and split only, canonical after the seed") {
  const PrecisionPolicy a = PrecisionPolicy::parse("split:nvfp4/fp32@16,skip=auto");
  CHECK(a.skip.mode == CheckpointSkip::Mode::automatic);
  CHECK(a.to_string() == "split:nvfp4+rtn/fp32@16,skip=auto");
  CHECK(a.skip.threshold_for(a.read) == 0.25f);              // NVFP4: u = 2^-2
  CHECK(a.skip.threshold_for(a.recur) == std::ldexp(1.0f, -24));  // FP32
  const PrecisionPolicy b = PrecisionPolicy::parse("shared:fp16+sr@8,skip=0.001,seed=4");
  CHECK(b.to_string() == "shared:fp16+sr@8,seed=4,skip=0.001");
  CHECK(PrecisionPolicy::parse(b.to_string()) == b);
  CHECK(b.skip.threshold_for(b.recur) == 0.001f);
  CHECK(PrecisionPolicy::parse("shared:bf16@4,skip=auto").skip.threshold_for({StorageFormat::bf16}) ==
        std::ldexp(1.0f, -8));
  CHECK(PrecisionPolicy::parse("shared:fp16@4").skip.threshold_for({StorageFormat::fp16}) == 0.0f);  // off
  CHECK_FALSE(PrecisionPolicy::parse("shared:fp32@16,skip=auto").is_fp32_exact());
  CHECK(PrecisionPolicy::parse("shared:fp32@16").is_fp32_exact());
  for (const auto& [text, fragment] : std::vector<std::pair<const char*, const char*>>{
           {"conv:fp16,skip=auto", "conventional decode reads its state every step"},
           {"shared:fp16@16,skip=0", "0 < T < 1"},
           {"shared:fp16@16,skip=1", "0 < T < 1"},
           {"shared:fp16@16,skip=fast", "'auto' or a decay threshold"},
           {"shared:fp16@16,skip=", "'auto' or a decay threshold"},
           {"shared:fp16@16,skip=auto,skip=auto", "'skip' given twice"},
           {"shared:fp16@16,skip", "'seed=N' and 'skip=auto|T' are accepted"}}) {
    CAPTURE(text);
    CHECK(test::error_of<std::invalid_argument>([&] { (void)PrecisionPolicy::parse(text); }).find(fragment) !=
          std::string::npos);
  }
}

TEST_CASE("paths without skipping refuse a skip policy") {
  const PrecisionPolicy p = PrecisionPolicy::parse("shared:nvfp4@16,skip=auto");
  // The literal decoders skip in standard decode (test_emulator: bit-identical to the emulator), not
  // in verification.
  CHECK_NOTHROW(ReplayDecoder(HeadGroupShape{Recurrence::mamba2, 16, 8, 1}, p, HeadGroupId{}));
  CHECK(test::error_of<std::invalid_argument>([&] {
          ReplayDecoder d(HeadGroupShape{Recurrence::mamba2, 16, 8, 1}, p, HeadGroupId{}, {.max_draft = 4});
        }).find("appendix F") != std::string::npos);
  CHECK(test::error_of<std::invalid_argument>([&] { check_state_error_policy(p); }).find("skips checkpoint reads") !=
        std::string::npos);
}

TEST_CASE("emulator with skip == float64 replay from the checkpoint read, or from zero below the threshold") {
  uint64_t seed = test::kBaseSeed * 1000 + 1100;
  std::printf("\n[checkpoint skip] non-flush steps / flushes that skipped the read; outputs vs float64 replay\n");
  const char* policies[] = {"shared:fp16+rtn@16,skip=auto", "split:nvfp4+rtn/fp32@16,skip=auto",
                            "split:nvfp4+rtn/fp16+sr@8,seed=2,skip=0.05", "shared:nvfp4+rtn@4,skip=0.3"};
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    for (const char* text : policies) {
      CAPTURE(to_string(kind));
      CAPTURE(text);
      const PrecisionPolicy p = PrecisionPolicy::parse(text);
      const bool split = p.scheme == DecodeScheme::split;
      const HeadGroupShape shape{kind, 32, 8, 3};
      const int n = 203, L = p.window, dk = shape.dk, dv = shape.dv, w = decay_width(kind, dk);
      // Decays from fast (0.2) to slow (1.0): some heads and windows fall below every threshold.
      // KDA decides on its slowest of 32 channels, so its decays are drawn from 0.05 to 0.7.
      const bool kda = kind == Recurrence::kda;
      const test::GroupData d = test::make_group_data(shape, n, kda ? 0.05f : 0.2f, kda ? 0.7f : 1.0f, ++seed);
      std::map<std::pair<int, int64_t>, Checkpoints> ckpt;  // (value head, token) -> stored copies
      std::vector<SkipCounts> counts(static_cast<std::size_t>(shape.n_value_heads));
      EmulatorOptions o;
      o.on_checkpoint = [&](int g, int64_t t, const float* recur, const float* read) {
        Checkpoints& c = ckpt[{g, t}];
        c.recur.assign(recur, recur + dv * dk);
        if (read) c.read.assign(read, read + dv * dk);
      };
      o.on_skip_counts = [&](int g, const SkipCounts& c) { counts[static_cast<std::size_t>(g)] = c; };
      const test::Outputs out = test::run_emulator(d, p, {}, o);

      SkipCounts total;
      double worst_out = 0.0, worst_ckpt = 0.0;
      for (int g = 0; g < shape.n_value_heads; ++g) {
        std::vector<float> recur(static_cast<std::size_t>(dv) * dk, 0.0f), read = recur;  // window start copies
        SkipCounts mine;
        for (int start = 0; start < n; start += L) {
          std::vector<float> gamma(static_cast<std::size_t>(w), 1.0f);
          for (int t = start; t < std::min(n, start + L); ++t) {
            const int h = t - start + 1;
            const bool flush = h == L;
            const float* a = &d.alpha[g][static_cast<std::size_t>(t) * w];
            for (int c = 0; c < w; ++c) gamma[c] *= a[c];
            float gmax = 0.0f;
            for (float x : gamma) gmax = std::max(gmax, x);
            const StateFormat& copy = flush || !split ? p.recur : p.read;
            const bool skip = gmax < p.skip.threshold_for(copy);
            (flush ? mine.flushes : mine.steps) += 1;
            (flush ? mine.flushes_skipped : mine.steps_skipped) += skip;
            // The float64 replay of tokens start..t from the copy read (or zero).
            const std::vector<float>& src = flush || !split ? recur : read;
            std::vector<double> S(src.size(), 0.0);
            if (!skip)
              for (std::size_t i = 0; i < S.size(); ++i) S[i] = src[i];
            for (int j = start; j <= t; ++j)
              step64(kind, S, dk, dv, &d.alpha[g][static_cast<std::size_t>(j) * w],
                     has_delta_rule(kind) ? d.beta[g][static_cast<std::size_t>(j)] : 0.0,
                     &d.v[g][static_cast<std::size_t>(j) * dv], &d.k[static_cast<std::size_t>(j) * dk]);
            double num = 0.0, den = 0.0;
            for (int i = 0; i < dv; ++i) {
              double o64 = 0.0;
              for (int c = 0; c < dk; ++c) o64 += S[i * dk + c] * d.q[static_cast<std::size_t>(t) * dk + c];
              const double e = out[g][static_cast<std::size_t>(t) * dv + i] - o64;
              num += e * e;
              den += o64 * o64;
            }
            worst_out = std::max(worst_out, std::sqrt(num / std::max(den, 1e-30)));
            if (flush) {  // the new checkpoint(s): one rounding of S
              const Checkpoints& c = ckpt.at({g, t});
              const auto check_copy = [&](const std::vector<float>& stored, const StateFormat& f) {
                double smax = 0.0, emax = 0.0;
                for (std::size_t i = 0; i < S.size(); ++i) {
                  smax = std::max(smax, std::fabs(S[i]));
                  emax = std::max(emax, std::fabs(stored[i] - S[i]));
                }
                const double bound = (formats::unit_roundoff(f.format) * 2.0 + 1e-5) * smax;  // SR: one step
                worst_ckpt = std::max(worst_ckpt, emax / std::max(smax, 1e-30));
                CHECK(emax <= bound);
              };
              check_copy(c.recur, p.recur);
              if (split) check_copy(c.read, p.read);
              recur = c.recur;
              if (split) read = c.read;
            }
          }
        }
        const SkipCounts& got = counts[static_cast<std::size_t>(g)];
        CHECK(got.steps == mine.steps);
        CHECK(got.steps_skipped == mine.steps_skipped);
        CHECK(got.flushes == mine.flushes);
        CHECK(got.flushes_skipped == mine.flushes_skipped);
        total.steps += got.steps, total.steps_skipped += got.steps_skipped;
        total.flushes += got.flushes, total.flushes_skipped += got.flushes_skipped;
      }
      std::printf("  %-6s %-44s %3lld/%3lld steps, %2lld/%2lld flushes skipped; outputs %.1e, checkpoints %.1e\n",
                  std::string(to_string(kind)).c_str(), text, static_cast<long long>(total.steps_skipped),
                  static_cast<long long>(total.steps), static_cast<long long>(total.flushes_skipped),
                  static_cast<long long>(total.flushes), worst_out, worst_ckpt);
      CHECK(worst_out <= 1e-4);  // float32 arithmetic over at most one window
      // The test can tell: some non-flush steps skip and some read (a policy whose flushes read FP32
      // skips them only below 2^-24, which these decays do not reach).
      CHECK(total.steps_skipped > 0);
      CHECK(total.steps_skipped < total.steps);
    }
  }
}
