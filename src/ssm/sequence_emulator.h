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
#include <functional>
#include <vector>

#include "ssm/precision_policy.h"
#include "ssm/ssm_types.h"

namespace replayssm::ssm {

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

// ---- additions to the contract (implementation: sequence_emulator.cpp) ----------------------
// Semantics, per value head (teacher forcing; states start at 0; window counter h starts at 0;
// flushes after tokens L, 2L, ...; SR streams as in state_quantizer.h):
//   conventional  S <- step(S); o_t = S q_t; S <- Q_recur(S)                (event = t - 1)
//   shared        S_run <- step(S_run) (GDN/KDA: u from S_run); o_t = S_run q_t; at a flush
//                 S_run <- Q_recur(S_run), the new checkpoint, from which the next window starts
//   split         S_read, S_recur running from the read (LP) and recur (HP) checkpoints, both
//                 stepped every token (GDN/KDA: u^LP from S_read, u^HP from S_recur); non-flush
//                 o_t = S_read q_t; flush o_t = S_recur q_t, then S_read <- Q_read(S_recur),
//                 S_recur <- Q_recur(S_recur)
//   ,skip=        (appendix F, precision_policy.h CheckpointSkip) a zero-started running state W,
//                 stepped every token (GDN/KDA: u from W), is REPLAY(0, B[1:h]); a non-flush step
//                 whose gamma_h is below the threshold of the copy it reads outputs W q, a flush
//                 whose gamma_L is below the recur copy's writes its checkpoint(s) from W
// The replayed state REPLAY(S_ckpt, B[1:h]) of the literal decoders is evaluated as the same
// fold, so checkpoints agree bit for bit with ReplayDecoder / SplitPrecisionReplayDecoder.

struct SkipCounts {
  int64_t steps = 0, steps_skipped = 0;      // non-flush steps
  int64_t flushes = 0, flushes_skipped = 0;  // flushes (skipped: pure writes)
};

struct EmulatorOptions {
  // Worker threads over the value heads of the group: 0 = std::thread::hardware_concurrency().
  // Small problems and runs with on_checkpoint or on_skip_counts run on the calling thread.
  int max_threads = 0;
  // Called after every quantization event with the value head, the 0-based token index at which
  // it happened, and the new stored state(s) as row-major dv x dk float arrays (recur copy; read
  // copy for split policies, else nullptr). For tests and diagnostics.
  std::function<void(int value_head, int64_t token, const float* recur, const float* read)> on_checkpoint;
  // Policies with ',skip=': called once per value head at the end of its sequence with the counts of
  // non-flush steps and flushes, and how many of each skipped the checkpoint read.
  std::function<void(int value_head, const SkipCounts& counts)> on_skip_counts;
};

void emulate_sequence(const HeadGroupSequence& in, const PrecisionPolicy& policy, HeadGroupId id,
                      const std::vector<float*>& out, const EmulatorOptions& options);

// ---- one whole layer: every key-head group (the CPU twin of cuda/ssm/sequence_scan.h) -----------
// Activations laid out as the model's projections produce them (row t = token t, heads side by
// side; any leading dimension). Value head h belongs to key head h / G (G = n_value_heads /
// n_key_heads) as value head h % G of its group, and its SR streams are those of
// HeadGroupId{layer, h / G}, value head h % G: the same as one emulate_sequence call per group.
struct LayerSequence {
  Recurrence kind = Recurrence::mamba2;
  int n_tokens = 0, dk = 0, dv = 0, n_key_heads = 1, n_value_heads = 1;
  const float* q = nullptr;      // q of key head g at token t: q + t * ld_q + g * dk
  int64_t ld_q = 0;
  const float* k = nullptr;      // k + t * ld_k + g * dk
  int64_t ld_k = 0;
  const float* alpha = nullptr;  // alpha + t * ld_alpha + h * decay_width(kind, dk)
  int64_t ld_alpha = 0;
  const float* beta = nullptr;   // beta + t * ld_beta + h (gdn, kda; null for mamba2)
  int64_t ld_beta = 0;
  const float* v = nullptr;      // v + t * ld_v + h * dv
  int64_t ld_v = 0;
  float* out = nullptr;          // out + t * ld_out + h * dv
  int64_t ld_out = 0;
};
// Threads run whole key head groups (EmulatorOptions::max_threads; one thread with on_checkpoint or
// on_skip_counts). Both callbacks receive the layer's value head h (not the index within the group). Throws as
// check_layer_sequence does.
void emulate_layer_sequence(const LayerSequence& seq, const PrecisionPolicy& policy, uint32_t layer,
                            const EmulatorOptions& options = {});

// The argument checks of emulate_layer_sequence, shared with its GPU twin: std::invalid_argument
// for shapes (n_value_heads a positive multiple of n_key_heads, G <= 256, dk, dv >= 1,
// n_tokens >= 0), the policy (as emulate_sequence), a missing operand, a leading dimension below
// its row width (heads x head width), or a beta given for mamba2; std::out_of_range when the layer
// or a key head does not fit its SR stream field. Nothing is checked about pointers when n_tokens = 0.
void check_layer_sequence(const LayerSequence& seq, const PrecisionPolicy& policy, uint32_t layer);

// Quantization events per value head over n_tokens: n_tokens (conventional), else
// floor(n_tokens / L) (flushes after tokens L, 2L, ...; a last partial window is not flushed).
uint64_t quantization_events(const PrecisionPolicy& policy, int n_tokens);

}  // namespace replayssm::ssm
