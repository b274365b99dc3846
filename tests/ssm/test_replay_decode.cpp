// Long FP32 runs: every ReplaySSM form (literal REPLAY, OUTPUT-ONLY, split with two FP32
// checkpoints, the sequence emulator) reproduces FP32 conventional decode, which in turn tracks an
// independent float64 oracle of the literal recurrences. All three recurrences, decays near 1
// and far from 1, every L in {1, 2, 4, 16, 64}, dk != dv, GQA (3 value heads per key head).
//
// Error measures (ssm_test_data.h RelError), per token and value head, maximised over the run:
// |o_t - ref_t| / |ref_t| (printed) and |o_t - ref_t| / rms|ref| (asserted, with the whole run's
// sqrt(sum |o - ref|^2 / sum |ref|^2)).
#include <doctest/doctest.h>

#include <cstdio>
#include <string>

#include "ssm/conventional_decode.h"
#include "ssm/replay_decode.h"
#include "ssm_test_data.h"

using namespace replayssm;
using namespace replayssm::ssm;
using replayssm::test::GroupData;
using replayssm::test::Outputs;
using replayssm::test::relative_error;

namespace {

constexpr int kTokens = 3000;
constexpr double kFp32Tolerance = 1e-5;    // ReplaySSM forms vs FP32 conventional
constexpr double kOracleTolerance = 1e-5;  // FP32 results vs the float64 oracle

void check_within(const test::RelError& e, double tol) {
  CHECK(e.max_token_rms <= tol);
  CHECK(e.run <= tol);
}

struct Regime {
  const char* name;
  float lo, hi;
};
constexpr Regime kRegimes[] = {{"a~0.999+", 0.999f, 1.0f}, {"a~0.5", 0.3f, 0.7f}};
constexpr int kWindows[] = {1, 2, 4, 16, 64};

}  // namespace

TEST_CASE("FP32: replay, output-only, split and emulator equal conventional decode over 3000 steps") {
  const HeadGroupShape base{Recurrence::mamba2, 48, 24, 3};
  uint64_t case_seed = test::kBaseSeed * 1000 + 100;
  double worst_rms = 0, worst_run = 0, worst_oracle_rms = 0, worst_oracle_run = 0;
  std::printf("\n[fp32 long runs] %d tokens, dk=%d dv=%d, %d value heads per key head; max per-token relative error\n",
              kTokens, base.dk, base.dv, base.n_value_heads);
  std::printf("%-7s %-9s %3s | %-9s %-9s %-9s %-9s %-9s %-9s | %-9s\n", "kind", "decay", "L", "replay", "out-only",
              "split-oo", "split-rep", "emu-shr", "emu-split", "conv/f64");
  for (Recurrence kind : {Recurrence::mamba2, Recurrence::gdn, Recurrence::kda}) {
    for (const Regime& regime : kRegimes) {
      HeadGroupShape shape = base;
      shape.kind = kind;
      const GroupData d = test::make_group_data(shape, kTokens, regime.lo, regime.hi, ++case_seed);
      const auto oracle = test::oracle_outputs(d);
      ConventionalDecoder conv(shape, PrecisionPolicy{});
      const Outputs ref = test::run_steps(conv, d);
      const auto conv_vs_oracle = relative_error(ref, oracle, shape.dv);
      CAPTURE(to_string(kind));
      CAPTURE(regime.name);
      check_within(conv_vs_oracle, kOracleTolerance);

      for (int L : kWindows) {
        CAPTURE(L);
        const PrecisionPolicy shared = PrecisionPolicy::parse("shared:fp32@" + std::to_string(L));
        const PrecisionPolicy split = PrecisionPolicy::parse("split:fp32/fp32@" + std::to_string(L));
        ReplayDecoder literal(shape, shared, {}, {.non_flush = NonFlushForm::materialize});
        ReplayDecoder output_only(shape, shared);
        SplitPrecisionReplayDecoder split_oo(shape, split);
        SplitPrecisionReplayDecoder split_literal(shape, split, {}, {.non_flush = NonFlushForm::materialize});
        const Outputs o_literal = test::run_steps(literal, d);
        const Outputs o_oo = test::run_steps(output_only, d);
        const Outputs o_split = test::run_steps(split_oo, d);
        const Outputs o_split_lit = test::run_steps(split_literal, d);
        const Outputs o_emu = test::run_emulator(d, shared);
        const Outputs o_emu_split = test::run_emulator(d, split);
        const test::RelError e[] = {relative_error(o_literal, ref, shape.dv), relative_error(o_oo, ref, shape.dv),
                                    relative_error(o_split, ref, shape.dv), relative_error(o_split_lit, ref, shape.dv),
                                    relative_error(o_emu, ref, shape.dv), relative_error(o_emu_split, ref, shape.dv)};
        std::printf("%-7s %-9s %3d | %-9.2e %-9.2e %-9.2e %-9.2e %-9.2e %-9.2e | %-9.2e\n",
                    std::string(to_string(kind)).c_str(), regime.name, L, e[0].max_token, e[1].max_token,
                    e[2].max_token, e[3].max_token, e[4].max_token, e[5].max_token, conv_vs_oracle.max_token);
        for (const auto& x : e) check_within(x, kFp32Tolerance);
        for (const auto& x : e) worst_rms = std::max(worst_rms, x.max_token_rms), worst_run = std::max(worst_run, x.run);
        // Every form is also checked directly against the float64 oracle.
        for (const Outputs* o : {&o_literal, &o_oo, &o_split, &o_emu}) {
          const auto eo = relative_error(*o, oracle, shape.dv);
          check_within(eo, kOracleTolerance);
          worst_oracle_rms = std::max(worst_oracle_rms, eo.max_token_rms);
          worst_oracle_run = std::max(worst_oracle_run, eo.run);
        }
        // The literal REPLAY form, the emulator and (Mamba-2) the output-only decoder keep the
        // very same running state as conventional decode at flushes: bit-identical checkpoints.
        CHECK(literal.flushes() == kTokens / L);
        for (int g = 0; g < shape.n_value_heads; ++g) {
          if (kTokens % L == 0) {
            CHECK(literal.checkpoint(g) == conv.state(g));
            CHECK(split_literal.recur_checkpoint(g) == conv.state(g));
            CHECK(split_oo.recur_checkpoint(g) == conv.state(g));  // HP path recomputes u^HP
            if (kind == Recurrence::mamba2) CHECK(output_only.checkpoint(g) == conv.state(g));
          }
        }
        if (L == 1) CHECK(o_literal == ref);  // every step is a flush step: REPLAY of one record
      }
    }
  }
  std::printf("  (table: pure per-token max |o-ref|/|ref|) worst vs FP32 conventional: per-token/rms %.2e, run %.2e; "
              "worst vs float64 oracle: per-token/rms %.2e, run %.2e\n",
              worst_rms, worst_run, worst_oracle_rms, worst_oracle_run);
}
