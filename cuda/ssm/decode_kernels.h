// CUDA decode kernels for Mamba-2, Gated DeltaNet and KDA (REPLAYSSM.md sections 2-4), a batch of B
// sequences, all heads, one launch per decode step:
//
//   conventional_step      read S, update, output, write S (the baseline: FP32, FP16 or BF16 state)
//   replay_step            ReplaySSM standard decode (Algorithms 1 and 4; Algorithm 3 with a separate
//                          low-precision read checkpoint). Each sequence keeps its window position h
//                          and ring start on the device, so sequences at different positions share a
//                          launch: a block whose sequence reaches h == L flushes (replays the window
//                          from the HP checkpoint, writes HP and, if split, the LP copy); other blocks
//                          run the output-only form from the read checkpoint.
//   verify_step            speculative verification of T drafts (Algorithm 2; GDN/KDA with the T x T
//                          unit-triangular UT solve): output-only, flush first when h + T > L. With
//                          a read (LP) copy, Algorithm 3: the LP copy is read when h + T <= L, the HP
//                          copy when h + T > L, and the flush writes both (decode_verify_split.cu).
//   commit_step            h <- h + a (pointer rollback by accepted length, a on the device).
//   snapshot_verify_step   the vLLM-style baseline: T sequential steps writing T state snapshots.
//   (prior_schemes.h: The Mamba in the Llama, Snakes and Ladders, STree as kernels, for figure 7.)
//
// CUDA Graphs (paper appendix D.2): with DeviceRecords::sync the per-sequence window parity lives on
// the device, so a captured step (verify + commit, or a standard step) replays with no host work.
//
// Layouts (row-major, value head major): q, k [B][G][dk] and v [B][H][dv] in bf16 (activations of a
// bf16 model), decays and betas [B][H] fp32, outputs [B][H][dv] fp32, states [B][H][dv][dk] in the
// container layout of formats::QuantizedMatrix per head. Records (ring of `capacity` slots per
// sequence): k [B][cap][G][dk] bf16, v [B][cap][H][dv] bf16, u [B][cap][H][dv] fp32 (GDN), a and b
// [B][cap][H] fp32. Bytes per record and head: Mamba-2 2dv + 4 (+ 2dk per key head); GDN adds the
// fp32 u (4dv) and b (4): GDN records keep u in fp32 so replay equals conventional to fp32 rounding.
//
// KDA (Kimi Delta Attention, channel-wise decay a_t in (0,1)^dk; decode_kda.cuh): as GDN (beta
// [B][H], fp32 u records) except that the decays are dk floats per token and value head: `alpha`
// is [B][H][dk] (T drafts: [B][T][H][dk]) and records.alpha is [B][cap][H][dk], fp32. A KDA record
// is 2dv + 4dv + 4dk + 4 bytes per head (+ 2dk per key head). The KDA kernels run one value head per
// block (the decay weights, and so the key products, differ per value head): ReplayConfig::
// heads_per_block must be 0 or 1 for kda.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "formats/quantized_matrix.h"
#include "ssm/ssm_types.h"

namespace replayssm::cuda {

// Recurrence (ssm/ssm_types.h): every launcher implements mamba2 and gdn; conventional_step,
// replay_step, verify_step and commit_step also kda (snapshot_verify_step refuses it).

struct DecodeShape {
  int batch = 1, key_heads = 1, value_heads = 1, dk = 128, dv = 64;
  int heads_per_group() const { return value_heads / key_heads; }
  std::size_t head_elements() const { return static_cast<std::size_t>(dv) * dk; }
  std::size_t heads() const { return static_cast<std::size_t>(batch) * value_heads; }
};

// One stored copy of the state of every (sequence, value head), in one format.
struct DeviceState {
  formats::StorageFormat format = formats::StorageFormat::fp32;
  uint8_t* payload = nullptr;            // heads x storage of one dv x dk matrix (codes)
  uint8_t* scale_codes = nullptr;        // nvfp4: heads x (dv*dk/16)
  float* block_scales = nullptr;         // fp8b128: heads x (dv*dk/128)
  float* tensor_scales = nullptr;        // nvfp4: heads
  // Error feedback (+ef, not in the paper; ssm::quantize_state with a residual): the FP32 residual
  // that this copy's last write dropped, heads x dv x dk row-major, zero-initialised by the caller.
  // Set exactly when the copy rounds with formats::Rounding::ef; a write then stores Q_rtn(S + E)
  // and keeps E <- (S + E) - Q_rtn(S + E), bit-identical to the CPU decoders.
  float* residual = nullptr;
};

struct StepInputs {
  const __nv_bfloat16* q = nullptr;  // [B][G][dk]   (T drafts: [B][T][G][dk])
  const __nv_bfloat16* k = nullptr;
  const __nv_bfloat16* v = nullptr;  // [B][H][dv]   (T drafts: [B][T][H][dv])
  const float* alpha = nullptr;      // [B][H]       (T drafts: [B][T][H])
  const float* beta = nullptr;       // GDN only
  float* out = nullptr;              // [B][H][dv]   (T drafts: [B][T][H][dv])
};

// Per-sequence window bookkeeping. Kept on the device in two copies (ping-pong): a step reads one
// and writes the other, so every block of a sequence reads the same value with no host round trip
// and no race; the launchers flip `parity`.
struct WindowState {
  int h = 0;              // committed records in the window
  int start = 0;          // ring slot of window position 0
  uint32_t flushes = 0;   // checkpoint writes so far (stochastic-rounding event counter)
  int reserved = 0;
};

// Device-resident parity of the window-state ping-pong, one per sequence (CUDA Graphs, paper appendix
// D.2). With DeviceRecords::sync set, every kernel reads window[sync[b].parity][b], and the last of a
// step's blocks for sequence b to finish flips that parity (a counter in `done`), so a captured step
// replays with no host involvement: the flush decisions (h + 1 >= L, h + T > L) and the commit
// h <- h + a are computed on the device from the device-resident h and accepted lengths. Without it
// the launchers flip DeviceRecords::parity on the host, which a captured graph would bake in.
struct WindowSync {
  int parity = 0;
  unsigned done = 0;  // blocks of the step in flight that have finished, for this sequence
};

struct DeviceRecords {
  int capacity = 0;
  __nv_bfloat16* k = nullptr;
  __nv_bfloat16* v = nullptr;
  float* u = nullptr;      // GDN corrections
  float* alpha = nullptr;
  float* beta = nullptr;   // GDN
  WindowState* window[2] = {nullptr, nullptr};
  int parity = 0;          // window[parity] is current
  // Largest T that verify_step is called with (0: standard decode only). A commit can leave up to
  // max(L, T) committed records, which the next standard step flushes (h + 1 >= L, as the CPU
  // decoder does), so this sizes the flush's staging and the verification's: capacity must be
  // max(L, T) + T, and max(L, T) + 1 <= 64.
  int max_drafts = 0;
  WindowSync* sync = nullptr;  // [B] on the device, zero-initialised; nullptr: host-side parity
};

// The launchers' limits, for callers that check their arguments before any GPU work (the bench):
// replay_step's and verify_step's window L (their shared memory and the flush's staging hold at most 64
// records; verification also needs max(L, T) + 1 <= 64) and verify_step's draft counts T.
inline constexpr int kMaxDecodeWindow = 64;
inline constexpr int kVerifyDraftCounts[] = {1, 2, 4, 8};

struct ReplayConfig {
  int window = 16;                  // L, 1 <= L <= kMaxDecodeWindow
  DeviceState recur;                // carries the recurrence (the paper's HP checkpoint: fp32, or fp16 with SR)
  DeviceState read;                 // read by non-flush steps when split (the LP checkpoint); unset: shared
  bool split() const { return read.payload != nullptr; }
  formats::Rounding recur_rounding = formats::Rounding::rtn;  // rtn, sr, or ef (recur.residual set)
  formats::Rounding read_rounding = formats::Rounding::rtn;   // split: rtn, or ef (read.residual set)
  uint64_t seed = 0;                // SR seed; streams: ssm::sr_stream with layer = sequence index
  int heads_per_block = 0;          // value heads per block (0: chosen from the shape and the GPU)
  // Value heads per block of the flush kernel alone (0: heads_per_block when that is forced, else the launcher's
  // choice), for studies of small batches, where the few flushing sequences' blocks can outlast the non-flush
  // grid. Mamba-2 and GDN; the KDA kernels refuse it.
  int flush_heads_per_block = 0;
  // Appendix F, decay-based checkpoint-read skipping (ssm::CheckpointSkip::threshold_for gives the
  // values; 0 never skips). gamma_h is the float32 product of the window's decays a_1 ... a_h in
  // token order, the current token's included (KDA: the largest over key channels), as the CPU
  // decoders compute it. A non-flush step whose gamma_h < skip_threshold_read (the threshold of the
  // copy it reads: split the read copy, shared the recur copy) does not read the checkpoint: it
  // outputs from REPLAY(0, B[1:h]) with every GDN/KDA correction recomputed from that state. A flush
  // whose gamma < skip_threshold_flush (the recur copy's) is a pure write of REPLAY(0, B[1:h]).
  // Standard decode only: verify_step refuses a skipping configuration, as the CPU decoders do.
  float skip_threshold_read = 0.0f;
  float skip_threshold_flush = 0.0f;
  bool skips() const { return skip_threshold_read > 0.0f || skip_threshold_flush > 0.0f; }
  // How a non-flush step reads an NVFP4 or FP8-b128 read copy: as tensor-core products (cuda/ssm/mma_read.cuh)
  // or on the CUDA cores. Both give the same values up to fp32 summation order. A tensor-core read exists
  // for NVFP4 on Mamba-2 and GDN and for FP8-b128 on GDN, at dk = 128 with dv % 16 == 0
  // (tensor_core_read_exists): replay_step refuses tensor_cores for an NVFP4 or FP8-b128 read copy anywhere
  // else. FP32, FP16 and BF16 reads ignore this, and verify_step always reads on the CUDA cores.
  // automatic: the tensor cores on grids of at least 4 blocks per SM, where they were measured faster.
  enum class ReadPath { automatic, cuda_cores, tensor_cores };
  ReadPath read_path = ReadPath::automatic;
  // The sequences that flush at this step (h + 1 >= L), when the caller knows them: a device array of
  // flush_count sequence indices in strictly increasing order. The flush kernel then puts blocks on these
  // sequences only, instead of on every (sequence, head group) with most of them returning at once: with
  // staggered windows B / L sequences flush per step, and the launch waves of the other blocks were 3-9% of
  // a low-precision read's step (H100, B = 256; experiments/bench/decode_2026-12-06/session24/). A serving
  // loop or a sweep that steps every sequence with standard steps knows the list: b flushes when its
  // h + 1 >= L, h advancing by one per step and returning to 0 after a flush. nullptr (flush_count 0):
  // the flush kernel covers every sequence, and so does a list of all B sequences. Any shorter list must be
  // exact: a listed sequence that does not flush, an index out of range or out of order, or a flushing
  // sequence that is missing stops the kernels (__trap: the step's next CUDA call reports an error)
  // rather than skip or repeat a flush. GDN with skip_threshold_read > 0 refuses a list (its flush kernel
  // also serves the skipped reads of sequences that do not flush).
  const int* flush_list = nullptr;
  int flush_count = 0;
};

// Whether replay_step has a tensor-core read (ReplayConfig::read_path) for a read copy in `read` format.
bool tensor_core_read_exists(ssm::Recurrence kind, formats::StorageFormat read, int dk, int dv);

// `rounding`: rtn, or ef with state.residual set (fp16/bf16 state; fp32 stores exactly).
void conventional_step(ssm::Recurrence kind, const DecodeShape& shape, const StepInputs& in, DeviceState state,
                       cudaStream_t stream, formats::Rounding rounding = formats::Rounding::rtn);

// One standard decode step for every sequence; advances each sequence's window (flips parity).
void replay_step(ssm::Recurrence kind, const DecodeShape& shape, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream);

// Speculative verification of T drafts (T in kVerifyDraftCounts, T <= records.max_drafts): outputs for
// the T positions, draft records written after the committed ones, flush when h + T > L. FP32
// checkpoint (shared) only.
void verify_step(ssm::Recurrence kind, const DecodeShape& shape, int drafts, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream);
// h[b] += accepted[b] for every sequence (1 <= accepted <= T): pointer rollback, nothing copied. In
// place on the current window state (no other kernel reads it meanwhile), so it flips no parity.
void commit_step(const DecodeShape& shape, const int* accepted, DeviceRecords& records, cudaStream_t stream);

// Baseline: T sequential updates from the state, writing each intermediate state to
// snapshots[s] (T full FP32 states) and the outputs.
void snapshot_verify_step(ssm::Recurrence kind, const DecodeShape& shape, int drafts, const StepInputs& in,
                          const float* state, float* snapshots, cudaStream_t stream);

// The KDA implementations the launchers above route `kind == kda` to (decode_kda_*.cu); same contracts.
namespace kda_detail {
void conventional_step(const DecodeShape& shape, const StepInputs& in, DeviceState state, cudaStream_t stream,
                       formats::Rounding rounding);
void replay_step(const DecodeShape& shape, const StepInputs& in, const ReplayConfig& config, DeviceRecords& records,
                 cudaStream_t stream);
void verify_step(const DecodeShape& shape, int drafts, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream);
}  // namespace kda_detail

}  // namespace replayssm::cuda
