// Prior speculative-decoding state-recovery schemes (paper appendix A; REPLAYSSM.md section 3, table
// "Prior state-recovery schemes") as GPU kernels for Mamba-2 and GDN with an FP32 state: B sequences,
// all heads, the DecodeShape / StepInputs layouts of decode_kernels.h (T drafts: q, k [B][T][G][dk],
// v [B][T][H][dv], alpha, beta [B][T][H], out [B][T][H][dv]). They exist to be compared with
// ReplaySSM's verification (verify_step / commit_step) and the vLLM snapshot baseline
// (snapshot_verify_step): each keeps the paper's full-state traffic pattern per verify step.
//
// Every scheme runs a verify phase (prior_verify_step: the T drafts' outputs) and a recovery phase
// once the accepted length a is known (prior_recover_step). Two schemes fuse the recovery of one
// verdict into the next verify step; all of them keep the drafts' layer inputs (an "activation
// cache", DraftCache) for the replay. Where the paper's one-line description leaves freedom, the
// reading chosen is the one that gives the table's traffic; it is stated per scheme:
//
//   mamba_in_llama     The Mamba in the Llama (Wang et al. 2024): 1R + 2W, one fused launch. Buffers:
//                      state[0] = C, the state before the previous verify step's drafts; state[1] = F,
//                      the state after all T of them. The verify step gets the previous verdict a':
//                      it reads C and replays the a' accepted cached drafts, or, when a' = T, reads F
//                      and replays nothing (F is then the committed state: our reading of why the
//                      chain is 2T-1 and not 2T); writes the committed state to C; runs the T new drafts
//                      (outputs); writes the state after them to F. Serial chain: a' + T <= 2T - 1.
//   activation_replay  Snakes and Ladders, Activation Replay (Wu et al. 2024): 3R + 3W, 3 launches.
//                      state[0] = C (committed), state[1] = W (the working state the verification
//                      forward updates in place, as a stock SSM forward writes its final state).
//                      Verify: read W, run the T drafts (outputs), write W. Recovery: recompute (read
//                      C, replay the a accepted cached drafts, write C), copy (C -> W).
//   joint_attainment   Snakes and Ladders, Joint Attainment and Advancement: 3R + 4W, the request
//                      padded to two batch rows (A: attainment, B: advancement) beside its committed
//                      state C. Our reading: the verify step gets the previous verdict a'; a copy
//                      launch replicates C into both rows (1R + 2W); one joint launch over the 2B rows
//                      (2R + 2W), padded to the same length a' + T: row A replays the a' accepted
//                      cached drafts then runs T padding (no-op) steps, row B replays them then runs
//                      the T new drafts (outputs); each row's final state is written back. Row A is
//                      the new committed state: C and A swap roles (state[rotation] is C).
//   stree              STree (Wu et al. 2026), the algorithm (2R + 1W; the released code's 5R + 4W
//                      adds redundant copies, not modelled). state[0] = C (committed). Verify: chunk
//                      scan of the T drafts from C (read C; the drafts' outputs in the parallel chunk
//                      form o_s = g_s C q_s + sum_{j<=s} g_{j+1:s} u_j (k_j.q_s), GDN corrections u by
//                      the T x T unit-triangular solve; no state written). Recovery: masked replay
//                      (read C, run all T cached drafts with the mask s < a, write C).
//
// The committed state is materialised by the recovery phase, except for mamba_in_llama and
// joint_attainment whose recovery of a verdict runs inside the next verify step
// (prior_recovery_lags): there the committed state after verify step k holds the verdicts up to
// step k - 1.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "ssm/decode_kernels.h"

namespace replayssm::cuda {

enum class PriorScheme : uint8_t { mamba_in_llama, activation_replay, joint_attainment, stree };
inline constexpr PriorScheme kPriorSchemes[] = {PriorScheme::mamba_in_llama, PriorScheme::activation_replay,
                                                PriorScheme::joint_attainment, PriorScheme::stree};
inline constexpr int kMaxPriorDrafts = 8;

// The scheme's name as in ssm::prior_speculative_schemes (src/ssm/analytic_model.h).
std::string_view to_string(PriorScheme s);
// Short key for tables and command lines: mil, snakes-ar, snakes-ja, stree.
std::string_view scheme_key(PriorScheme s);

// One kernel launch of a scheme's verify step (after_verdict = false) or recovery (true), with the
// full FP32 states it streams per request. Derived from the launch plans the launchers configure
// their kernels from (rows streamed, states stored per row): the launchers check every launch's
// configuration against its plan, so these counts are what the kernels move.
struct PriorLaunch {
  std::string_view kernel;
  bool after_verdict = false;
  int state_reads = 0, state_writes = 0;
};
std::vector<PriorLaunch> prior_scheme_launches(PriorScheme s);
struct PriorTraffic {
  int state_reads = 0, state_writes = 0;
};
PriorTraffic prior_scheme_traffic(PriorScheme s);  // the sum over the launches of one verify step
// Serial recurrence steps per state row in one verify step + its recovery, verdict a (1 <= a <= T):
// the longest dependent chain the scheme's kernels run (the chunk scan counts 0: no chain).
int prior_scheme_chain_steps(PriorScheme s, int drafts, int accepted);
// Whether the committed state lags one verdict (recovery fused into the next verify step).
bool prior_recovery_lags(PriorScheme s);
// Full FP32 state buffers ([B][H][dv][dk] each) the scheme needs: 2, 2, 3, 1.
int prior_state_buffers(PriorScheme s);

// The T drafts' layer inputs kept for the replay after the verdict (StepInputs layouts with T tokens).
struct DraftCache {
  __nv_bfloat16* k = nullptr;  // [B][T][G][dk]
  __nv_bfloat16* v = nullptr;  // [B][T][H][dv]
  float* alpha = nullptr;      // [B][T][H]
  float* beta = nullptr;       // [B][T][H] (GDN)
};

// Device buffers of one scheme. The caller allocates them and sets the committed state (zeros: the
// CPU decoders' initial state) before the first verify step; the launchers flip parity/rotation.
struct PriorBuffers {
  int drafts = 0;                 // T, fixed for the buffers' life (1 <= T <= kMaxPriorDrafts)
  float* state[3] = {nullptr, nullptr, nullptr};
  DraftCache cache[2];            // cache[parity]: the last verify step's drafts
  int parity = 0;
  int rotation = 0;               // joint_attainment: state[rotation] is C, state[1 - rotation] is row A
};

// The verify phase for every sequence: outputs of the T drafts into in.out. prev_accepted (device,
// [B], 0 <= a' <= T, 0 before the first verdict) is read by mamba_in_llama and joint_attainment,
// which recover the previous verdict here; the others ignore it (may be null).
void prior_verify_step(PriorScheme scheme, ssm::Recurrence kind, const DecodeShape& shape, const StepInputs& in,
                       const int* prev_accepted, PriorBuffers& buffers, cudaStream_t stream);
// The recovery phase after the verdict (device [B], 1 <= a <= T): activation_replay and stree launch
// their recovery kernels; mamba_in_llama and joint_attainment launch nothing (they take the verdict
// as prev_accepted of the next verify step).
void prior_recover_step(PriorScheme scheme, ssm::Recurrence kind, const DecodeShape& shape, const int* accepted,
                        PriorBuffers& buffers, cudaStream_t stream);
// The committed state ([B][H][dv][dk]) the scheme holds now (see prior_recovery_lags).
const float* prior_committed_state(PriorScheme scheme, const PriorBuffers& buffers);

}  // namespace replayssm::cuda
