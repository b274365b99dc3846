// replayssm formats: print each number format's definition and run the self-check
// (Philox known answers, code round trips, and the committed numpy/ml_dtypes golden file).
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "formats/quantized_matrix.h"
#include "formats/self_check.h"

namespace replayssm::cli {
namespace {

constexpr const char* kDefinitions = R"(Number formats (definitions: shared spec FORMATS.md; bit-exact to the oracles named)
  format    bits       max      stored per element        RTN oracle / notes
  fp32      1/8/23     3.4e38   4 B                       reference
  fp16      1/5/10     65504    2 B                       CUDA __float2half_rn; overflow->inf, NaN->0x7FFF
  bf16      1/8/7      3.39e38  2 B                       CUDA __float2bfloat16_rn; NaN->0x7FFF
  e4m3      1/4/3      448      1 B                       CUDA __nv_cvt_float_to_fp8 SATFINITE; any NaN->0x7F
  e2m1      1/2/1      6        0.5 B (2 per byte, lo first) CUDA __nv_cvt_float_to_fp4 RN; saturating; NaN->+6
  fp8b128   e4m3 + f32 scale/128  1.03 B                 s = amax/448 (s==0 -> 1); q = e4m3(x * min(1/s, FLT_MAX))
  nvfp4     e2m1 + e4m3 scale/16 + f32 tensor scale      Transformer Engine recipe (multiply by reciprocal):
                                  0.5625 B               S_enc = 2688/amax, S_dec_b = e4m3(amax_b*(S_enc/6)),
                                                         q = e2m1(x * min(1/(S_dec_b*S_dec), FLT_MAX))
  Non-finite input in a block (nvfp4, fp8b128): the whole block decodes to NaN (scale = NaN).
Rounding
  rtn  round to nearest, ties to even
  sr   stochastic: hi with probability (x-lo)/(hi-lo), from 32 Philox4x32-10 bits keyed by
       (seed, stream, element index): identical on CPU and GPU for any thread count.
       |x| > max finite, inf and NaN are rounded as RTN.
)";

std::string find_default_goldens() {
  for (const char* candidate : {"data/goldens/formats_v1.json", "../data/goldens/formats_v1.json"})
    if (std::filesystem::exists(candidate)) return candidate;
  return "data/goldens/formats_v1.json";
}

}  // namespace

void register_formats(CLI::App& app) {
  auto goldens = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand("formats", "Print each number format's definition and run the format self-check");
  cmd->add_option("--goldens", *goldens, "golden file from scripts/make_format_goldens.py (default data/goldens/formats_v1.json)");
  cmd->callback([goldens] {
    std::cout << kDefinitions << "\nSelf-check\n";
    std::vector<formats::CheckResult> results = {formats::check_philox_known_answers(), formats::check_code_round_trip()};
    const std::string path = goldens->empty() ? find_default_goldens() : *goldens;
    const auto golden = formats::check_golden_file(path);
    int golden_failed = 0;
    for (const auto& g : golden) golden_failed += !g.passed;
    for (const auto& r : results) std::cout << fmt::format("  [{}] {}: {}\n", r.passed ? "PASS" : "FAIL", r.name, r.detail);
    for (const auto& g : golden)
      if (!g.passed) std::cout << fmt::format("  [FAIL] golden {}: {}\n", g.name, g.detail);
    std::cout << fmt::format("  [{}] golden file {}: {} of {} cases bit-equal\n", golden_failed ? "FAIL" : "PASS", path,
                             golden.size() - golden_failed, golden.size());
    bool ok = golden_failed == 0;
    for (const auto& r : results) ok = ok && r.passed;
    std::cout << (ok ? "All format checks passed.\n" : "FORMAT CHECK FAILED.\n");
    if (!ok) throw CLI::RuntimeError(1);
  });
}

}  // namespace replayssm::cli
