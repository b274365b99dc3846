// Analytic models of the paper's appendix C (REPLAYSSM.md sections 3, 6, 7): memory traffic and
// FLOPs of conventional vs ReplaySSM decode, the optimal window, the SSM-vs-attention crossover,
// the prior speculative state-recovery schemes, and the error-propagation limits of C.6.
//
// Units: bytes are exact integers (uint64_t); FLOPs, ratios and limits are doubles. "Per head"
// is one value head's dv x dk state; "per layer" multiplies by the layer's value heads.
// Nothing here depends on a GPU: these are the numbers a kernel's measured traffic is judged against.
//
// ---- Memory traffic of one window of L steps (one head) ------------------------------------
// M_S = bytes of one state in its storage format (b*dv*dk; scales included for block formats).
//   conventional:  L reads + L writes of the state:               M_conv   = 2 L M_S
//   replay (Alg. 1/4): L reads of the checkpoint + 1 write at the flush, plus records:
//                                                  M_replay = (L+1) M_S + (L-1)(L+2)/2 * r
//   with r = 2dv + 2dk + 4 bytes per record (v or u and k in bf16, the decay alpha in fp32).
// The record term, counted step by step: step i of the window (i = 1..L) starts with the i-1
// earlier records of the window in memory and produces its own record on chip.
//   reads:  step i reads the i-1 earlier records              -> sum_i (i-1) = L(L-1)/2
//   writes: each non-flush step (i < L) appends its record    -> L-1
//           the flush step folds its own record straight into the checkpoint, never storing it
//   total  L(L-1)/2 + (L-1) = (L-1)(L+2)/2 records.
// So the paper's formula assumes the current step's record stays on chip. Reading it back
// ("step h reads REPLAY(B[1:h])", h records including its own) would give L(L+1)/2 reads instead.
// tests/ssm/test_analytic_model.cpp re-derives the count by running Algorithm 1 against a
// byte-counting memory.
//
// Separate precisions (Alg. 3, standard decode): non-flush steps read the low-precision copy
// (M_LP), the flush step reads the high-precision copy (M_HP) and writes both:
//   M_split = (L-1) M_LP + M_HP + (M_HP + M_LP) + records.
// GDN with two precisions stores (alpha, beta, u, v, k) per record (section 4) so that a flush can
// recompute u on the high-precision path: r = 4dv + 2dk + 8 (alpha, beta fp32; u, v, k bf16).
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "formats/quantized_matrix.h"
#include "ssm/model_shapes.h"

namespace replayssm::ssm {

// ---- sizes ------------------------------------------------------------------------------------

// Bytes of one dv x dk state (rows dv, blocks along dk) in format f, scales included
// (formats::storage_bytes). Throws std::invalid_argument when dv, dk < 1 or dk is not a multiple
// of f's block size.
uint64_t state_bytes(int dv, int dk, formats::StorageFormat f);

// Record of one head: (alpha fp32, v or u bf16, k bf16) = 2dv + 2dk + 4.
uint64_t record_bytes(int dv, int dk);
// GDN record when the state is kept in two precisions: (alpha, beta fp32, u, v, k bf16) = 4dv + 2dk + 8.
uint64_t split_gdn_record_bytes(int dv, int dk);
// KDA (beyond the paper): the decay is a dk-vector, kept in fp32 (the CUDA kernels' records):
// (alpha 4dk, u bf16, k bf16) = 2dv + 6dk; two precisions (alpha 4dk, beta, u, v, k) = 4dv + 6dk + 4.
uint64_t kda_record_bytes(int dv, int dk);
uint64_t split_kda_record_bytes(int dv, int dk);
// The record a head of this recurrence stores, single (split = false) or two precisions.
uint64_t record_bytes(Recurrence kind, bool split, int dv, int dk);

// Record bytes of one SSM layer. share_keys = false is the paper's per-head accounting
// (value_heads x r). share_keys = true stores k once per key head (GQA / Mamba-2 n_groups):
// value_heads x (record minus 2dk) + key_heads x 2dk.
uint64_t layer_record_bytes(const ModelShape& shape, bool split, bool share_keys);

// ---- traffic per window -----------------------------------------------------------------------

struct Traffic {
  uint64_t state_read = 0, state_write = 0, record_read = 0, record_write = 0;
  uint64_t state() const { return state_read + state_write; }
  uint64_t records() const { return record_read + record_write; }
  uint64_t total() const { return state() + records(); }
};

// The record term (L-1)(L+2)/2 * r of one window (see the header comment for what it counts).
uint64_t replay_record_traffic(uint64_t record_bytes, int window);
// All functions taking a window throw std::invalid_argument when window < 1.
Traffic conventional_window_traffic(uint64_t state_bytes, int window);
Traffic replay_window_traffic(uint64_t state_bytes, uint64_t record_bytes, int window);
Traffic split_window_traffic(uint64_t recur_state_bytes, uint64_t read_state_bytes, uint64_t record_bytes, int window);
// Mean traffic of the L-1 non-flush steps of a window (the steps a low-precision read speeds up):
// one checkpoint read, (L-2)/2 record reads and one record write on average. Throws when window < 2.
double replay_nonflush_step_bytes(uint64_t read_state_bytes, uint64_t record_bytes, int window);

// ---- FLOPs (one head) -------------------------------------------------------------------------
// h = records already in the buffer before the current input (the current one adds one more term).

// Conventional step: decay dv dk + outer product dv dk + sum dv dk + S q (2 dv dk - dv) = 5 dv dk - dv.
double conventional_step_flops(int dv, int dk);
// Materialised replay step: build S from the checkpoint and h+1 outer products (~2(h+2) dv dk),
// then S q (2 dv dk): 2(h+3) dv dk.
double materialised_step_flops(int dv, int dk, int h);
// Output-only step: S_ckpt q (2 dv dk) + k_j^T q for h+1 records (2(h+1) dk) + weighted sum of the
// v_j (2(h+1) dv): 2 dv dk + 2(h+1)(dv + dk). k_j^T q is shared by a key head's value heads; this
// per-head count does not discount that.
double output_only_step_flops(int dv, int dk, int h);

struct WindowFlops {
  double conventional = 0;        // L conventional steps
  double materialised = 0;        // every step materialises the state: sum_{h=0}^{L-1} 2(h+3) dv dk
  double output_only = 0;         // steps 1..L-1 output-only (h = 0..L-2), flush materialised (h = L-1)
};
WindowFlops window_flops(int dv, int dk, int window);

// ---- optimal window (paper C.5) ---------------------------------------------------------------
// Per-token traffic with mean accepted tokens a and T drafts per verify step:
//   f(L) = M_S/a + M_S/L + rL/(2a) - r/2 + rT/a - rT/L,
// minimised at L* = sqrt(2 a (M_S/r - T)).
// Standard decode is a = T = 1 (one token verified and accepted per step): then f(L) equals
// M_replay(L)/L exactly, and L* = sqrt(2 (M_S/r - 1)). (T = 0 gives sqrt(2 M_S/r): 13.0 instead
// of 12.9 for Nemotron-3-Super; both round to the paper's 13.)
double per_token_traffic(double window, double state_bytes, double record_bytes, double mean_accepted = 1.0,
                         double drafts = 1.0);
// Throws std::invalid_argument unless state_bytes, record_bytes > 0, mean_accepted > 0 and
// M_S/r > T (no interior optimum otherwise).
double optimal_window(double state_bytes, double record_bytes, double mean_accepted = 1.0, double drafts = 1.0);

// ---- speculative verification (section 3, paper appendix A) ------------------------------------

// Full-state traffic of one verify step of T drafts, in units of one state (M_S).
struct SchemeTraffic {
  std::string_view name;
  double state_reads = 0, state_writes = 0;
  std::string_view note;
};
// vLLM snapshots (1R + T W), The Mamba in the Llama (1R + 2W), Snakes and Ladders activation
// replay (3R + 3W) and joint attainment (3R + 4W), STree algorithm (2R + 1W) and as released
// (5R + 4W). Record / cached-input traffic of these schemes is not included. Throws when T < 1.
std::vector<SchemeTraffic> prior_speculative_schemes(int drafts);

// ReplaySSM verification (Algorithm 2) averaged over many verify steps, with a deterministic
// acceptance sequence of mean `mean_accepted` (a_k = floor((k+1) a) - floor(k a), values
// floor(a) and ceil(a)). Per verify step: one checkpoint read; a checkpoint write when the flush
// test h + T > L fires; T draft records written; the h committed records read (the T drafts are
// on chip). Throws std::invalid_argument unless 1 <= T <= L and 1 <= mean_accepted <= T.
struct SpeculativeReplayTraffic {
  double state_reads = 0, state_writes = 0;    // per verify step, in states
  double record_reads = 0, record_writes = 0;  // per verify step, in records
  double tokens = 0;                           // committed tokens per verify step (= mean_accepted)
  double bytes_per_step(uint64_t state_bytes, uint64_t record_bytes) const;
  double bytes_per_token(uint64_t state_bytes, uint64_t record_bytes) const {
    return bytes_per_step(state_bytes, record_bytes) / tokens;
  }
};
SpeculativeReplayTraffic speculative_replay_traffic(int window, int drafts, double mean_accepted);

// ---- hybrid model: SSM vs attention crossover (paper C.2) ---------------------------------------

// One SSM layer's states (value_heads x dv x dk) in format f.
uint64_t layer_state_bytes(const ModelShape& shape, formats::StorageFormat f);
// Conventional decode, one step, all SSM layers: read + write every state.
uint64_t model_ssm_conventional_step_bytes(const ModelShape& shape, formats::StorageFormat f);
// Context length N at which attention's KV reads (attention_layers x kv_bytes_per_token x N) equal
// ssm_step_bytes. Throws std::invalid_argument unless attention_layers >= 1 and kv_bytes_per_token > 0.
double crossover_context_tokens(double ssm_step_bytes, int attention_layers, double kv_bytes_per_token);

// ---- error propagation (paper C.6, REPLAYSSM.md section 6) ---------------------------------------
// A rounding error e with mean b and variance sigma2 enters the recurrence D_t = alpha D_{t-1} + e_t.
// Every function requires 0 <= alpha < 1 (std::invalid_argument otherwise). The variance formulas
// assume uncorrelated errors (stochastic rounding; RTN errors are correlated, its mean formulas still hold).

// Conventional decode, state quantised every step, after N roundings from D_0 = 0.
double conventional_error_mean(double b, double alpha, long long n);       // b (1 - alpha^N) / (1 - alpha)
double conventional_error_variance(double sigma2, double alpha, long long n);  // sigma2 (1 - alpha^2N) / (1 - alpha^2)
double conventional_error_mean_limit(double b, double alpha);              // b / (1 - alpha)
double conventional_error_variance_limit(double sigma2, double alpha);     // sigma2 / (1 - alpha^2)
// Shared low-precision checkpoint with window L: one rounding per window, decayed by alpha^L
// between roundings. The deviation of the checkpoint (just after a flush) tends to these; an
// output h steps into the next window sees alpha^h times it.
double shared_checkpoint_error_mean_limit(double b, double alpha, int window);          // b / (1 - alpha^L)
double shared_checkpoint_error_variance_limit(double sigma2, double alpha, int window);  // sigma2 / (1 - alpha^2L)
// Separate precisions: the recurrence is exact (high precision), the output of a non-flush step h
// steps after the flush reads the low-precision copy once: one rounding decayed by alpha^h, for
// any sequence length N.
double separate_output_error_mean(double b, double alpha, int h);          // alpha^h b
double separate_output_error_variance(double sigma2, double alpha, int h);  // alpha^2h sigma2

}  // namespace replayssm::ssm
