// Vocabulary shared by the CPU reference (src/ssm), the model layers, the CUDA kernels (cuda/ssm) and
// the tests. C++17 and dependency-free: the .cu files include it.
#pragma once
#include <cstdint>
#include <string_view>

namespace replayssm::ssm {

// The three recurrences of REPLAYSSM.md section 1 (state S in R^{dv x dk}):
//   mamba2: S_t = a_t S_{t-1} + v_t k_t^T
//   gdn:    S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T        (Gated DeltaNet)
//   kda:    S_t = S_{t-1} Diag(a_t)(I - b_t k_t k_t^T) + b_t v_t k_t^T   (Kimi Delta Attention)
enum class Recurrence : uint8_t { mamba2, gdn, kda };

constexpr std::string_view to_string(Recurrence r) {
  switch (r) {
    case Recurrence::mamba2:
      return "mamba2";
    case Recurrence::gdn:
      return "gdn";
    case Recurrence::kda:
      return "kda";
  }
  return "?";
}
constexpr bool has_delta_rule(Recurrence r) { return r != Recurrence::mamba2; }
constexpr bool has_channel_decay(Recurrence r) { return r == Recurrence::kda; }
// Floats of one token's decay for one value head: 1, or dk for kda.
constexpr int decay_width(Recurrence r, int dk) { return r == Recurrence::kda ? dk : 1; }

// The two stored copies of a state under separate precisions (Algorithm 3), named by their role:
//   recur  the copy the recurrence continues from at a flush (the paper's HP checkpoint);
//   read   the copy non-flush steps read (the paper's LP checkpoint).
// Under shared and conventional decoding there is one copy, the recur copy, read by every step.
// The values are part of the stochastic-rounding stream id (state_quantizer.h): never renumber.
enum class CheckpointCopy : uint8_t { recur = 0, read = 1 };

}  // namespace replayssm::ssm
