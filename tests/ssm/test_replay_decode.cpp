// Long FP32 runs: every ReplaySSM form (literal REPLAY, OUTPUT-ONLY, split with two FP32
// checkpoints, the sequence emulator) reproduces FP32 conventional decode, which in turn tracks an
// independent float64 oracle of the literal recurrences. All three recurrences, decays near 1
// and far from 1, every L in {1, 2, 4, 16, 64}, dk != dv, GQA (3 value heads per key head).
//
// Asserted with the comparison rule of test_util.h, relative to each element and to the run's RMS
// output (|o - ref| <= tol (rms|ref| + |ref|): an output that nearly cancels has a large pure
// relative error from rounding alone); the table prints each run's sqrt(sum |o-ref|^2 / sum |ref|^2).
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
using replayssm::test::compare_close;
using replayssm::test::relative_to_rms;
using replayssm::test::run_error;

namespace {

constexpr int kTokens = 3000;
constexpr double kFp32Tolerance = 1e-5;    // ReplaySSM forms vs FP32 conventional
constexpr double kOracleTolerance = 1e-5;  // FP32 results vs the float64 oracle

template <class Ref>  // float outputs or the float64 oracle's
void check_within(const Outputs& got, const std::vector<std::vector<Ref>>& ref, double tol, const char* what) {
  CHECK_CLOSE(compare_close(got, ref, relative_to_rms(tol, ref), what));
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
  double worst_run = 0, worst_oracle_run = 0;
  std::printf("\n[fp32 long runs] %d tokens, dk=%d dv=%d, %d value heads per key head; relative run error\n",
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
      const double conv_vs_oracle = run_error(ref, oracle, shape.dv);
      CAPTURE(to_string(kind));
      CAPTURE(regime.name);
      check_within(ref, oracle, kOracleTolerance, "conventional vs float64 oracle");

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
        const Outputs* forms[] = {&o_literal, &o_oo, &o_split, &o_split_lit, &o_emu, &o_emu_split};
        const char* names[] = {"replay", "out-only", "split-oo", "split-rep", "emu-shr", "emu-split"};
        double e[6];
        for (int i = 0; i < 6; ++i) {
          e[i] = run_error(*forms[i], ref, shape.dv);
          check_within(*forms[i], ref, kFp32Tolerance, names[i]);
          worst_run = std::max(worst_run, e[i]);
        }
        std::printf("%-7s %-9s %3d | %-9.2e %-9.2e %-9.2e %-9.2e %-9.2e %-9.2e | %-9.2e\n",
                    std::string(to_string(kind)).c_str(), regime.name, L, e[0], e[1], e[2], e[3], e[4], e[5],
                    conv_vs_oracle);
        // Every form is also checked directly against the float64 oracle.
        for (int i : {0, 1, 2, 4}) {
          check_within(*forms[i], oracle, kOracleTolerance, names[i]);
          worst_oracle_run = std::max(worst_oracle_run, run_error(*forms[i], oracle, shape.dv));
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
  std::printf("  worst run error vs FP32 conventional %.2e, vs the float64 oracle %.2e\n", worst_run, worst_oracle_run);
}
