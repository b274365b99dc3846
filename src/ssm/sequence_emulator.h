// Teacher-forced sequence emulator (the KL sweeps run on it): given one key head group's inputs
// for N tokens, produce the N outputs exactly as decoding under a PrecisionPolicy would, at one
// (conventional, shared) or two (split) state passes per token — no O(L) replay per step. Tests
// prove it agrees with the literal algorithms of ssm/replay_decode.h to fp32 rounding.
//
// A "head group" is one key head (k, q) and the G value heads that share it (GQA; Mamba-2
// n_groups). Conventions follow REPLAYSSM.md section 1: state S in R^{dv x dk}, o = S q.
//   mamba2: S_t = a_t S_{t-1} + v_t k_t^T                 (caller passes v = dt*x, a = exp(dt*A))
//   gdn:    S_t = a_t S_{t-1} (I - b_t k_t k_t^T) + b_t v_t k_t^T   (caller L2-normalises and scales q)
//   kda:    S_t = S_{t-1} Diag(a_t)(I - b_t k_t k_t^T) + b_t v_t k_t^T,  a_t in (0,1)^dk
// The output is o_t = S_t q_t (after the update), before any D skip or gating (layer code adds those).
#pragma once
#include <cstdint>
#include <vector>

#include "ssm/precision_policy.h"

namespace replayssm::ssm {

enum class Recurrence : uint8_t { mamba2, gdn, kda };

struct HeadGroupSequence {
  Recurrence kind = Recurrence::mamba2;
  int n_tokens = 0, dk = 0, dv = 0, n_value_heads = 1;
  const float* q = nullptr;  // n_tokens x dk, row-major
  const float* k = nullptr;  // n_tokens x dk
  // One pointer per value head:
  std::vector<const float*> alpha;  // mamba2/gdn: n_tokens; kda: n_tokens x dk
  std::vector<const float*> beta;   // gdn/kda: n_tokens; empty for mamba2
  std::vector<const float*> v;      // n_tokens x dv
};

// Identifies the head group for stochastic-rounding streams (layer and key head), so that every
// head draws independent bits and a rerun draws the same ones.
struct HeadGroupId {
  uint32_t layer = 0;
  uint32_t key_head = 0;
};

// out[g] receives n_tokens x dv outputs of value head g. Throws std::invalid_argument on
// inconsistent shapes. Outputs may be non-finite when a low-precision state overflows: that is
// a result, not an error.
void emulate_sequence(const HeadGroupSequence& in, const PrecisionPolicy& policy, HeadGroupId id,
                      const std::vector<float*>& out);

}  // namespace replayssm::ssm
