// The error of the stored state, measured against the FP32 state and predicted by the error model
// of REPLAYSSM.md section 6 (paper appendix C.6), for one head group's real inputs (issue 11).
//
// The same inputs run twice through the sequence emulator: under conv:fp32 (the exact states S_t)
// and under the policy (the stored states). At every flush e (token (e + 1) L - 1) the copy that
// non-flush steps read — the shared checkpoint, or the split LP copy — differs from S by D_e.
// The model: D_e = gamma_e D_{e-1} + r_e with gamma_e = prod alpha over the window and r_e one
// rounding of the state in the stored format, of bias b and variance sigma^2 (measured here by
// rounding S at each flush once more, with the same stream). Steady state, rounding errors
// independent from flush to flush:
//   shared    E[D^2] = sigma^2 / (1 - E[gamma^2]) + (b / (1 - E[gamma]))^2           ("independent")
//   split     E[D^2] = sigma_read^2 + b_read^2, plus the recur copy's own shared-type term when it
//             is not FP32 (the LP copy is one rounding of the HP state)
// When rounding errors repeat from flush to flush (RTN of a slowly changing state) they add up
// coherently instead: E[D^2] -> E[r^2] / (1 - E[gamma])^2, reported as the "coherent" bound. For
// Mamba-2 the recurrence carries D exactly by gamma; for GDN and KDA the delta rule's (I - beta k
// k^T) factors shrink D further, so the model is an upper estimate there. KDA decays each key channel
// (column of S) by its own gamma, so the model is applied per column (that column's rounding moments
// and gamma) and averaged over the columns; channel_mean_predicted_ms keeps the model with gamma
// averaged over the channels first, which under-predicts heads with a few slow channels.
#pragma once
#include <cstdint>
#include <vector>

#include "ssm/precision_policy.h"
#include "ssm/sequence_emulator.h"

namespace replayssm::ssm {

struct HeadStateError {
  int value_head = 0;             // in the layer: key_head * n_value_heads + the head in its group
  int64_t events = 0;             // flushes
  int64_t steady_events = 0;      // the second half of them, where the measured values are taken
  double state_ms = 0.0;          // mean S^2 over the elements of the steady-state flushes
  double measured_ms = 0.0;       // mean D^2 of the read copy, steady state
  double measured_bias = 0.0;     // mean D, steady state
  double recur_measured_ms = 0.0; // split: mean D^2 of the recur (HP) copy; shared: = measured_ms
  // One rounding of the exact state at the steady-state flushes (same streams as the policy's):
  double rounding_bias = 0.0, rounding_var = 0.0;              // in the read format
  double recur_rounding_bias = 0.0, recur_rounding_var = 0.0;  // split: in the recur format (0: FP32)
  double mean_gamma = 0.0, mean_gamma2 = 0.0;                  // over the windows (KDA: and channels)
  double predicted_ms = 0.0;      // the independent-errors model above (KDA: per column, averaged)
  double coherent_ms = 0.0;       // the coherent bound above (KDA: per column, averaged)
  double channel_mean_predicted_ms = 0.0;  // the model with gamma averaged over the channels (= predicted_ms unless KDA)
  // Mamba-2 only (NaN otherwise): the rounding errors the policy's recur copy actually received,
  // r_e = D_e - gamma_e D_{e-1} (exact for a scalar decay, up to FP32 arithmetic in the window),
  // at the steady-state flushes. They differ from one rounding of the exact state because the value
  // rounded is the carried checkpoint plus a window's update: on a slow head it lies near the
  // checkpoint's grid point, where SR's variance (x - lo)(hi - x) is small and RTN returns to the
  // same point. realized_cross = mean gamma_e D_{e-1} r_e (0 when r is independent of the carried
  // error, as SR's is given its input); realized_predicted_ms = the shared model with these moments.
  double realized_bias = 0.0, realized_var = 0.0, realized_cross = 0.0, realized_predicted_ms = 0.0;
};

// std::invalid_argument for a policy this measurement does not cover: conventional (its error
// model is per token), FP32-exact (no error), or error feedback (+ef: the model's one rounding of
// the exact state is no rounding ef makes; its stored error is bounded by the residual instead).
void check_state_error_policy(const PrecisionPolicy& policy);

// One entry per value head of the group. Throws as check_state_error_policy, and for a sequence
// shorter than two windows; otherwise the checks of emulate_sequence.
std::vector<HeadStateError> measure_state_error(const HeadGroupSequence& seq, const PrecisionPolicy& policy,
                                                HeadGroupId id);

}  // namespace replayssm::ssm
