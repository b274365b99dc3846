// What the two kernels of a ReplaySSM standard decode step share (decode_replay_nonflush.cu and
// decode_replay_flush.cu; the step itself, decode_replay.cu, launches one after the other).
#pragma once
#include "ssm/decode_common.cuh"

namespace replayssm::cuda::decode_detail {

// ================================ ReplaySSM standard decode ===================================
// A replay block serves NH value heads of one key head (NH * dv <= 256, NH divides the heads per
// key head): the key products are computed once for them, the NH states stream as one contiguous
// (NH*dv) x dk matrix (heads are adjacent in memory), and the record phase has one thread per
// (head, row). Blocks of a sequence whose window reaches L records flush instead (replay the window
// from the recur (HP) checkpoint on chip, write the recur copy and the read (LP) copy). As in the CPU
// decoder the flush condition is h + 1 >= L: after a verification commit h can be L or more (up to
// max(L, T)), and that step folds all h + 1 records.
struct ReplayArgs {
  DecodeShape shape;
  StepInputs in;
  int window;
  DeviceState recur, read;
  bool split;
  formats::RoundingMode recur_mode;
  uint64_t seed;
  DeviceRecords rec;
  int heads_per_block;  // NH of the kernel launched with these arguments (the two kernels may differ)
  int stage;            // positions a flush may stage: L, or max(L, T) + 1 when the ring serves verification
  // Blocks per sequence of each kernel (their grid.x); step_blocks_of says how many of them a sequence has.
  unsigned nonflush_blocks = 0, flush_blocks = 0;
  // ReplayConfig::flush_list: the flush grid's rows are these sequences (nullptr: row b is sequence b).
  const int* flush_list = nullptr;
  int flush_count = 0;
  ReplayConfig::ReadPath read_path = ReplayConfig::ReadPath::automatic;
  // Error feedback (+ef): the recur copy's writes add recur.residual (fp16 recur copy); the read
  // copy's do when read.residual is set. recur_mode is then nearest_even.
  bool recur_ef = false;
  float skip_read = 0.0f, skip_flush = 0.0f;  // appendix F (ReplayConfig::skip_threshold_read / _flush; 0: never)
  bool bf16_records = false;  // non-flush blocks stage their records in bf16-sized room (bf16_sized_records)
};

// Builds the kernels' arguments from a ReplayConfig after the host-side checks every replay and
// verification launcher shares: ef exactly on copies with a residual, and the recur copy's rounding.
inline ReplayArgs make_replay_args(const DecodeShape& shape, const StepInputs& in, const ReplayConfig& config,
                                   const DeviceRecords& records, int heads_per_block, int stage) {
  const formats::RoundingMode recur_mode = checked_rounding(config.recur, config.recur_rounding, "recur");
  if (config.split()) {
    checked_rounding(config.read, config.read_rounding, "read");
    if (config.read_rounding == formats::Rounding::sr)
      throw std::invalid_argument("decode kernels: the read (LP) copy rounds with RTN or ef, not SR");
  } else if (config.read.residual != nullptr) {
    throw std::invalid_argument("decode kernels: a read-copy residual without a read copy");
  }
  if (config.skip_threshold_read < 0.0f || config.skip_threshold_read >= 1.0f || config.skip_threshold_flush < 0.0f ||
      config.skip_threshold_flush >= 1.0f)
    throw std::invalid_argument("decode kernels: skip thresholds are in [0, 1) (0: never skip); got read " +
                                std::to_string(config.skip_threshold_read) + ", flush " +
                                std::to_string(config.skip_threshold_flush));
  ReplayArgs A{shape, in, config.window, config.recur, config.read, config.split(), recur_mode, config.seed, records,
               heads_per_block, stage};
  A.recur_ef = config.recur_rounding == formats::Rounding::ef;
  A.skip_read = config.skip_threshold_read;
  A.skip_flush = config.skip_threshold_flush;
  A.read_path = config.read_path;
  // A list of all B sequences is the full grid (the flush kernel's plain instance, which serves flushing and
  // non-flushing sequences alike, so that a wrong such list still gives right numbers).
  const bool whole_batch = config.flush_list && config.flush_count == shape.batch;
  A.flush_list = whole_batch ? nullptr : config.flush_list;
  A.flush_count = A.flush_list ? config.flush_count : 0;
  return A;
}

// Host-side checks of ReplayConfig::flush_list (the device checks its entries against the window states).
inline void check_flush_list(const ReplayConfig& config, const DecodeShape& shape) {
  if (config.flush_list == nullptr && config.flush_count != 0)
    throw_invalid_argument("ReplayConfig::flush_count without a flush_list (nullptr: every sequence gets flush blocks)",
                           "flush_count", config.flush_count);
  if (config.flush_list != nullptr && (config.flush_count < 0 || config.flush_count > shape.batch))
    throw_invalid_argument("ReplayConfig::flush_count must be in [0, B]", "flush_count", config.flush_count, "B",
                           shape.batch);
}

// Whether the step launches its flush kernel: not for an empty flush list. The non-flush kernel is then a
// plain launch instead of the flush kernel's programmatic dependent.
inline bool flush_kernel_launched(const ReplayArgs& A) { return A.flush_list == nullptr || A.flush_count > 0; }

// The grids step_block_done's counts assume (replay_step sets them; step_blocks_of): a grid that disagreed
// would flip a sequence's window parity before all its blocks had read the window, or never.
inline void check_step_blocks(const ReplayArgs& A, dim3 grid, bool flush_kernel) {
  const unsigned columns = flush_kernel ? A.flush_blocks : A.nonflush_blocks;
  const unsigned rows = flush_kernel && A.flush_list ? static_cast<unsigned>(A.flush_count) : static_cast<unsigned>(A.shape.batch);
  if (A.nonflush_blocks == 0 || A.flush_blocks == 0 || grid.x != columns || grid.y != rows)
    throw std::logic_error("replay step: a " + std::string(flush_kernel ? "flush" : "non-flush") + " grid of " +
                           std::to_string(grid.x) + " x " + std::to_string(grid.y) + " blocks against ReplayArgs' " +
                           std::to_string(columns) + " x " + std::to_string(rows) + " (nonflush_blocks " +
                           std::to_string(A.nonflush_blocks) + ", flush_blocks " + std::to_string(A.flush_blocks) + ")");
}

// The window state after this step: a flush folds the h + 1 records (position h + 1 becomes position 0).
__device__ __forceinline__ WindowState next_window(const WindowState& win, bool flush, int capacity) {
  WindowState next = win;
  if (flush) {
    next.h = 0;
    next.start = (win.start + win.h + 1) % capacity;
    next.flushes = win.flushes + 1;
  } else {
    next.h = win.h + 1;
  }
  return next;
}

// Blocks of this step that serve sequence b, whose flush decision is `flush` (step_block_done counts them):
// every non-flush block, and the flush kernel's blocks unless a flush list leaves b out of its grid.
__device__ __forceinline__ unsigned step_blocks_of(const ReplayArgs& A, bool flush) {
  return A.nonflush_blocks + (A.flush_list == nullptr || flush ? A.flush_blocks : 0u);
}

// The sequence a flush block serves: row blockIdx.y of the grid, or with a flush list that row's entry,
// which must be a sequence index above the row before's (strictly increasing, so no sequence twice).
__device__ __forceinline__ int flush_block_sequence(const ReplayArgs& A) {
  const int row = static_cast<int>(blockIdx.y);
  if (A.flush_list == nullptr) return row;
  const int b = A.flush_list[row];
  if (b < 0 || b >= A.shape.batch || (row > 0 && A.flush_list[row - 1] >= b)) __trap();
  return b;
}

// Non-flush kernels, once per step and sequence: the block at blockIdx.x == 0 of a sequence that does not flush
// writes its next window state (the flush kernel writes the flushing sequences'; with a flush list it has no
// block for the others). With a list every block of a flushing sequence also checks that the list has it
// (block-wide; returns only if so): the flush kernel has no block for a sequence the list lacks, so its flush
// would be silently lost. (KDA's plain non-flush kernel leaves the write to its flush kernel, which covers every
// sequence there: decode_kda_replay_nonflush.cu says why.)
__device__ __forceinline__ void nonflush_window_duties(const ReplayArgs& A, int b, const WindowState& win, bool flush) {
  if (!flush) {
    if (blockIdx.x == 0 && threadIdx.x == 0) write_next_window(A.rec, b, next_window(win, false, A.rec.capacity));
    return;
  }
  if (A.flush_list == nullptr) return;
  int found = 0;
  for (int i = threadIdx.x; i < A.flush_count; i += blockDim.x) found |= A.flush_list[i] == b;
  if (!__syncthreads_or(found)) __trap();
}

// Dynamic shared memory of a replay block. Non-flush blocks stage the NH heads' record vectors;
// flush blocks also stage the window's keys (fp32), shared by the NH heads, and at dk = 128, in rows
// padded by kKeyPad floats, a buffer of kFoldRows rows per warp plus q_t and k_t, for the fold
// on the tensor cores (decode_replay_flush.cu): the buffer takes a warp's checkpoint rows (loaded
// into it, or moved through it between the checkpoint layout and the mma layout). The pad keeps that
// path's key fragments free of bank conflicts: at a record stride of 136 floats the four records a
// lane quad reads start 8 banks apart. Per-position arrays have `stride` slots per head: L for
// non-flush blocks (they stage at most L - 1 records), the launch's `stage` for flush blocks.
constexpr int kKeyPad = 8;
constexpr int kFoldRows = 8;  // rows of one warp's fold (kFlushRows)
__host__ __device__ constexpr bool flush_fold_buffer(int DK) { return DK == 128; }
// Other dk keep unpadded rows: no tensor-core path reads their keys.
__host__ __device__ constexpr int flush_key_stride(int DK) { return DK + (flush_fold_buffer(DK) ? kKeyPad : 0); }
__host__ __device__ constexpr std::size_t flush_fold_floats(int DK) {
  return flush_fold_buffer(DK) ? static_cast<std::size_t>(kWarps) * kFoldRows * flush_key_stride(DK) + 2 * DK : 0;
}

struct ReplayShared {
  int stride;
  int key_stride;  // floats from one staged key to the next (flush)
  float* keys;     // [stride][key_stride] (flush only)
  float* fold;     // [kWarps][kFoldRows][key_stride] (flush at dk = 128)
  float* query;    // [2][DK] q_t, k_t (flush at dk = 128)
  float* vals;     // flush: [NH][stride][dv] record vectors, pre-multiplied by w unless u is recomputed;
                   // non-flush: [staged][NH dv] as the ring stores them (Mamba-2 bf16, GDN fp32 u)
  float* a;        // [NH][stride] decays
  float* w;        // [NH][stride] decay weights prod_{l>p} a_l
  float* beta;     // [NH][stride] (GDN flush)
  float* c1;       // [stride]  key products k_p . q_t
  float* c2;       // [stride]  k_p . k_t (GDN)
  float* rows1;    // [NH*dv] S q
  float* rows2;    // [NH*dv] S k (GDN)
  float* gamma;    // [NH]
  float* scratch;  // [kWarps]
  float* skip;     // [NH] appendix F: 1 when the head skips its checkpoint read this step, else 0
  uint32_t* mma_b;  // [32][kMmaBStride] non-flush: each lane's B fragments of the tensor-core read (16-byte aligned)
};

// Row stride (words) of the tensor-core read's B table: 16 fragments per lane at dk = 128, padded so that
// a quarter-warp's 16-byte loads fall in distinct banks.
constexpr int kMmaBStride = 20;
__host__ __device__ constexpr std::size_t mma_b_floats(bool flush) { return flush ? 0 : 32 * kMmaBStride + 4; }

// Floats of sh.vals: NH heads x L positions x dv as fp32 (flush blocks; GDN's u), or as the ring's bf16 where
// `bf16_records` (bf16_sized_records): half the room, rounded up to whole 16-byte pieces so that what follows stays
// aligned as before.
__host__ __device__ constexpr std::size_t replay_vals_floats(bool bf16_records, int L, int dv, int NH) {
  const std::size_t values = static_cast<std::size_t>(NH) * L * dv;
  return bf16_records ? (values + 7) / 8 * 4 : values;
}

// Which non-flush blocks may size sh.vals for bf16: Mamba-2's (they stage the ring's bf16 vectors) with an NVFP4
// read, the one read whose heads per block the room decides; ReplayArgs::bf16_records says whether they do. At
// L = 16 it lets Nemotron-3-Super's NVFP4 read take 16 heads per block (3 blocks per SM; fp32 room fits 8): 0.86x
// the read's time on an H100 at B = 128 and 256 (experiments/bench/decode_2026-12-06/session28/, calls 3-4;
// as landed, 0.863x / 0.853x: session30/).
__host__ __device__ constexpr bool bf16_sized_records(ssm::Recurrence kind, StorageFormat read) {
  return kind == ssm::Recurrence::mamba2 && read == StorageFormat::nvfp4;
}

__host__ __device__ inline std::size_t replay_shared_floats(int L, int DK, int dv, int NH, bool flush, bool bf16_records) {
  return (flush ? static_cast<std::size_t>(L) * flush_key_stride(DK) + flush_fold_floats(DK) : 0) +
         replay_vals_floats(bf16_records, L, dv, NH) + 3 * static_cast<std::size_t>(NH) * L + 2 * L + 2 * NH * dv +
         2 * NH + kWarps + mma_b_floats(flush);
}

__host__ __device__ __forceinline__ ReplayShared carve_shared(float* base, int L, int DK, int dv, int NH, bool flush,
                                                     bool bf16_records) {
  ReplayShared s;
  s.stride = L;
  s.key_stride = flush_key_stride(DK);
  s.keys = base;  // every piece up to vals is a multiple of 4 floats: vals stays 16-byte aligned
  s.fold = s.keys + (flush ? static_cast<std::size_t>(L) * s.key_stride : 0);
  s.query = s.fold + (flush ? static_cast<std::size_t>(kWarps) * kFoldRows * s.key_stride : 0);
  s.vals = s.fold + (flush ? flush_fold_floats(DK) : 0);
  s.a = s.vals + replay_vals_floats(bf16_records, L, dv, NH);
  s.w = s.a + NH * L;
  s.beta = s.w + NH * L;
  s.c1 = s.beta + NH * L;
  s.c2 = s.c1 + L;
  s.rows1 = s.c2 + L;
  s.rows2 = s.rows1 + NH * dv;
  s.gamma = s.rows2 + NH * dv;
  s.scratch = s.gamma + NH;
  s.skip = s.scratch + kWarps;
  // 16-byte aligned past skip (the base is; the +4 floats of mma_b_floats leave room). Advanced from s.skip as a
  // pointer, not rebuilt from an integer, so that ptxas still knows it is shared memory: from an integer, the
  // reads of the B table and of what follows it were generic loads (about 20 instructions to form one address).
  float* const after = s.skip + NH;
  const int pad = static_cast<int>((16 - reinterpret_cast<std::uintptr_t>(after) % 16) % 16) / 4;
  s.mma_b = flush ? nullptr : reinterpret_cast<uint32_t*>(after + pad);
  return s;
}

// carve_shared's layout as offsets in floats from the dynamic shared memory's base, computed on the host once per
// launch for the NVFP4 non-flush kernel (NonflushConstants); the same regions at the same addresses as carve_shared
// for a 16-byte aligned base, which the dynamic shared memory's is (carve_shared's vals assume it too); the two
// are kept equal by tests/cuda/test_decode_layout.cu (host, every shape of a grid). mma_b < 0: none (flush blocks).
struct SharedLayout {
  int stride, key_stride;
  int fold, query, vals, a, w, beta, c1, c2, rows1, rows2, gamma, scratch, skip, mma_b;
};
__host__ __device__ inline SharedLayout shared_layout(int L, int DK, int dv, int NH, bool flush, bool bf16_records) {
  SharedLayout o;
  o.stride = L;
  o.key_stride = flush_key_stride(DK);
  o.fold = flush ? L * o.key_stride : 0;  // keys at 0 (flush only)
  o.query = o.fold + (flush ? kWarps * kFoldRows * o.key_stride : 0);
  o.vals = o.fold + (flush ? static_cast<int>(flush_fold_floats(DK)) : 0);
  o.a = o.vals + static_cast<int>(replay_vals_floats(bf16_records, L, dv, NH));
  o.w = o.a + NH * L;
  o.beta = o.w + NH * L;
  o.c1 = o.beta + NH * L;
  o.c2 = o.c1 + L;
  o.rows1 = o.c2 + L;
  o.rows2 = o.rows1 + NH * dv;
  o.gamma = o.rows2 + NH * dv;
  o.scratch = o.gamma + NH;
  o.skip = o.scratch + kWarps;
  o.mma_b = flush ? -1 : (o.skip + NH + 3) / 4 * 4;  // carve_shared's 16-byte rounding past skip
  return o;
}

// The regions at their offsets, advanced from `base` (the kernel's extern shared array) as pointers, so that ptxas
// knows they are shared memory (carve_shared says why that matters).
__host__ __device__ __forceinline__ ReplayShared carve_shared_at(float* base, const SharedLayout& o) {
  ReplayShared s;
  s.stride = o.stride;
  s.key_stride = o.key_stride;
  s.keys = base;
  s.fold = base + o.fold;
  s.query = base + o.query;
  s.vals = base + o.vals;
  s.a = base + o.a;
  s.w = base + o.w;
  s.beta = base + o.beta;
  s.c1 = base + o.c1;
  s.c2 = base + o.c2;
  s.rows1 = base + o.rows1;
  s.rows2 = base + o.rows2;
  s.gamma = base + o.gamma;
  s.scratch = base + o.scratch;
  s.skip = base + o.skip;
  s.mma_b = o.mma_b < 0 ? nullptr : reinterpret_cast<uint32_t*>(base + o.mma_b);
  return s;
}

// What every warp of every NVFP4 non-flush block would otherwise derive from the launch's shape, computed once per
// launch by launch_replay_nonflush and passed as the kernel's second parameter: the shared-memory layout and
// SmallDiv's reciprocals. Per warp they took 247 of the 2,224 warp instructions a warp of Qwen3.5-122B's NVFP4 read
// (Nsight Compute per-instruction counts against sm_90 -lineinfo SASS, experiments/bench/decode_2026-12-07/
// session35/). Only the NVFP4 instances use them: moved into every instance (H9, session 36), the FP32 and FP8
// reads and the flush kernel lost up to 12% to register allocation changes.
struct NonflushConstants {
  SharedLayout layout{};
  int heads_per_group = 1;           // value heads per key head
  float inv_heads_per_group = 0.0f;  // SmallDiv's 1 / heads_per_group; 0: outside SmallDiv's range, divide
  float inv_dv = 0.0f;               // SmallDiv's 1 / dv (row -> head)
  float inv_record_pieces = 0.0f;    // SmallDiv's 1 / (16-byte record pieces a position); 0: none
};

// Appendix F: sh.skip[n] = 1 when head n's gamma = a_0 a_1 ... a_h0 (window positions 0..h0, the
// current token's decay at h0) is below `threshold`, else 0; all 0 when threshold is 0. The product
// is taken in token order in float32, as ssm::ReplayDecoderBase::skips_checkpoint_read takes it,
// so both make the same decision. One warp per head; the decays go to lane 0 in order by shuffles.
// Whole block; ends with __syncthreads.
__device__ __forceinline__ void stage_skip_flags(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                                 const ReplayShared& sh, int h0, float threshold) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int n = warp; n < bg.NH; n += kWarps) {
    float gamma = 1.0f;
    if (threshold > 0.0f) {
      const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
      float a[2] = {1.0f, 1.0f};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int p = lane + 32 * half;
        if (p <= h0) a[half] = p == h0 ? A.in.alpha[hb] : A.rec.alpha[ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n];
      }
      gamma = __shfl_sync(kFullMask, a[0], 0);
      for (int p = 1; p <= h0; ++p) gamma = __fmul_rn(gamma, __shfl_sync(kFullMask, p < 32 ? a[0] : a[1], p % 32));
    }
    if (lane == 0) sh.skip[n] = threshold > 0.0f && gamma < threshold ? 1.0f : 0.0f;
  }
  __syncthreads();
}

// Decay weights of the window for the block's NH heads, one warp per head: w[n][p] =
// prod_{l>p} a_l over the staged positions, gamma[n] = prod a (eq. 5); the raw decays go to
// sh.a and, for GDN, the betas to sh.beta (both [NH][L]). Positions p < h0 are ring records,
// p == h0 the current token.
__device__ __forceinline__ void stage_decay_weights(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                                    const ReplayShared& sh, int h0, int staged, bool gdn) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, L = sh.stride;
  for (int n = warp; n < bg.NH; n += kWarps) {
    const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
    float a[2] = {1.0f, 1.0f};
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int p = lane + 32 * half;
      if (p >= staged) continue;
      const std::size_t rec = ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n;
      a[half] = p == h0 ? A.in.alpha[hb] : A.rec.alpha[rec];
      sh.a[n * L + p] = a[half];
      if (gdn) sh.beta[n * L + p] = p == h0 ? A.in.beta[hb] : A.rec.beta[rec];
    }
    const SuffixProducts w = warp_suffix_products(a[0], a[1]);
    if (lane < staged) sh.w[n * L + lane] = w.lo;
    if (lane + 32 < staged) sh.w[n * L + lane + 32] = w.hi;
    if (lane == 0) sh.gamma[n] = w.gamma;
  }
}

// Record vectors as 16-byte chunks, when dv and the buffers allow: Mamba-2 8 bf16 values of v per load,
// GDN 4 values (fp32 u, or bf16 v as 8 bytes). Nsight Compute (2026-12-04, experiments/bench/
// decode_2026-12-04/call2_mma_verify/) counted the element-pair staging below at about 25 warp
// instructions per pair, most of them index math (head, window position, ring slot) redone per pair;
// per chunk the same math serves 4-8 values. The values stored are the same, bit for bit: bf16 -> fp32
// is exact, and a weighted value is the same single product. Returns false where it does not apply.
template <ssm::Recurrence K>
__device__ __forceinline__ bool stage_record_chunks(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                                    float* vals, int L, int h0, int staged, bool raw_v,
                                                    const float* weights, const float* raw_heads, const SmallDiv& per_head) {
  constexpr bool kMamba2 = K == ssm::Recurrence::mamba2;
  constexpr int kChunk = kMamba2 ? 8 : 4;
  const int dv = bg.dv;
  const auto misaligned = [](const void* ptr, int bytes) { return reinterpret_cast<std::uintptr_t>(ptr) % bytes != 0; };
  if (dv % kChunk != 0 || misaligned(A.in.v, 2 * kChunk) || misaligned(A.rec.v, 2 * kChunk) || misaligned(vals, 16) ||
      (!kMamba2 && misaligned(A.rec.u, 16)))
    return false;
  const int chunks = dv / kChunk;  // per vector
  const SmallDiv per_vector(chunks);
  struct Where {
    int n, p, col;
  };
  const auto where = [&](int i) {
    const int vec = per_vector(i), n = per_head(vec);
    return Where{n, vec - n * staged, (i - vec * chunks) * kChunk};
  };
  // Raw v (bf16) for Mamba-2, for a split flush's recomputed u, and for skipped GDN heads; else the cached u.
  const auto raw_head = [&](int n) { return kMamba2 || raw_v || (raw_heads && raw_heads[n] != 0.0f); };
  const auto bf16_bits_to_float = [](uint32_t pair, int half) { return __uint_as_float(half == 0 ? pair << 16 : pair & 0xFFFF0000u); };
  using Chunk = std::conditional_t<kMamba2, uint4, float4>;
  copy_unrolled<4>(
      bg.NH * staged * chunks,
      [&](int i) -> Chunk {
        const Where at = where(i);
        const std::size_t head = static_cast<std::size_t>(bg.head0) + at.n;
        const std::size_t rec = (ring_slot(A.rec, bg.b, win, at.p) * bg.H + head) * dv + at.col;
        const std::size_t cur = (static_cast<std::size_t>(bg.b) * bg.H + head) * dv + at.col;
        const __nv_bfloat16* v = at.p == h0 ? A.in.v + cur : A.rec.v + rec;
        if constexpr (kMamba2) {
          return *reinterpret_cast<const uint4*>(v);
        } else {
          if (!raw_head(at.n)) return *reinterpret_cast<const float4*>(A.rec.u + rec);
          const uint2 b = *reinterpret_cast<const uint2*>(v);
          return make_float4(bf16_bits_to_float(b.x, 0), bf16_bits_to_float(b.x, 1), bf16_bits_to_float(b.y, 0),
                             bf16_bits_to_float(b.y, 1));
        }
      },
      [&](int i, Chunk x) {
        const Where at = where(i);
        const bool weighted = weights && !(!kMamba2 && raw_heads && raw_heads[at.n] != 0.0f);
        const float w = weighted ? weights[at.n * L + at.p] : 1.0f;
        float4* dst = reinterpret_cast<float4*>(vals + (static_cast<std::size_t>(at.n) * L + at.p) * dv + at.col);
        const auto scaled = [&](float4 f) { return weighted ? make_float4(f.x * w, f.y * w, f.z * w, f.w * w) : f; };
        if constexpr (kMamba2) {
          dst[0] = scaled(make_float4(bf16_bits_to_float(x.x, 0), bf16_bits_to_float(x.x, 1), bf16_bits_to_float(x.y, 0),
                                      bf16_bits_to_float(x.y, 1)));
          dst[1] = scaled(make_float4(bf16_bits_to_float(x.z, 0), bf16_bits_to_float(x.z, 1), bf16_bits_to_float(x.w, 0),
                                      bf16_bits_to_float(x.w, 1)));
        } else {
          dst[0] = scaled(x);
        }
      });
  return true;
}

// Record vectors of the block's NH heads at window positions [0, staged) into vals [NH][L][dv]
// (L = `stride`): Mamba-2 v (bf16; position h0 is the current token's v), GDN the cached fp32 u,
// or with `raw_v` the GDN v (split flush recomputes u). With `weights` (sh.w, [NH][L]) each vector
// is stored multiplied by its decay weight w_p. `raw_heads` (sh.skip, or nullptr): heads n with
// raw_heads[n] != 0 take the raw v unweighted too (a skipped GDN read recomputes every u from zero).
// Eight independent loads per thread in flight. kChunked: 16-byte chunks where they apply (above);
// the flush kernel chunks only in its plain Mamba-2 instances at dk >= 128 (chunked_flush_records in
// decode_replay_flush.cu says why).
template <ssm::Recurrence K, bool kChunked>
__device__ __forceinline__ void stage_record_vectors(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                                     float* vals, int stride, int h0, int staged, bool raw_v,
                                                     const float* weights, const float* raw_heads = nullptr) {
  const int dv = bg.dv, L = stride;
  const SmallDiv per_head(staged);
  if constexpr (kChunked)
    if (stage_record_chunks<K>(A, bg, win, vals, stride, h0, staged, raw_v, weights, raw_heads, per_head)) return;
  if (dv % 2 == 0) {  // element pairs: one 4-byte (bf16) or 8-byte (fp32) load per pair
    copy_vectors(
        bg.NH * staged, dv / 2,
        [&](int vec, int pair) {
          const int n = per_head(vec), p = vec - n * staged, r = 2 * pair;
          const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
          const std::size_t rec = (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n) * dv + r;
          if (K == ssm::Recurrence::mamba2 || raw_v || (raw_heads && raw_heads[n] != 0.0f))
            return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p == h0 ? A.in.v + hb * dv + r : A.rec.v + rec));
          return *reinterpret_cast<const float2*>(A.rec.u + rec);
        },
        [&](int vec, int pair, float2 x) {
          const int n = per_head(vec), p = vec - n * staged;
          const bool weighted = weights && !(K != ssm::Recurrence::mamba2 && raw_heads && raw_heads[n] != 0.0f);
          const float w = weighted ? weights[n * L + p] : 1.0f;
          *reinterpret_cast<float2*>(vals + (static_cast<std::size_t>(n) * L + p) * dv + 2 * pair) =
              weighted ? make_float2(x.x * w, x.y * w) : x;
        });
    return;
  }
  copy_vectors(
      bg.NH * staged, dv,
      [&](int vec, int r) {
        const int n = per_head(vec), p = vec - n * staged;
        const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + n;
        const std::size_t rec = (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0 + n) * dv + r;
        if (K == ssm::Recurrence::mamba2 || raw_v || (raw_heads && raw_heads[n] != 0.0f))
          return __bfloat162float(p == h0 ? A.in.v[hb * dv + r] : A.rec.v[rec]);
        return A.rec.u[rec];
      },
      [&](int vec, int r, float x) {
        const int n = per_head(vec), p = vec - n * staged;
        const bool weighted = weights && !(K != ssm::Recurrence::mamba2 && raw_heads && raw_heads[n] != 0.0f);
        vals[(static_cast<std::size_t>(n) * L + p) * dv + r] = weighted ? x * weights[n * L + p] : x;
      });
}

// Appends the current record of the block's NH heads (the key once per key head).
__device__ __forceinline__ void append_record(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win, int DK,
                                              bool gdn) {
  const std::size_t slot = ring_slot(A.rec, bg.b, win, win.h);
  if (bg.vh0 == 0)
    for (int c = threadIdx.x; c < DK; c += kThreads)
      A.rec.k[(slot * bg.G + bg.g) * DK + c] = A.in.k[(static_cast<std::size_t>(bg.b) * bg.G + bg.g) * DK + c];
  // The NH heads' values are one contiguous run in both the inputs and the ring slot: copied in 16-byte
  // pieces where both ends allow (Nsight Compute, 2026-12-04: the per-element copy with its runtime
  // division by dv was 4% of the non-flush read's instructions).
  const int n = bg.NH * bg.dv;
  const __nv_bfloat16* src = A.in.v + (static_cast<std::size_t>(bg.b) * bg.H + bg.head0) * bg.dv;
  __nv_bfloat16* dst = A.rec.v + (slot * bg.H + bg.head0) * bg.dv;
  if (n % 8 == 0 && reinterpret_cast<std::uintptr_t>(src) % 16 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0) {
    for (int i = threadIdx.x; i < n / 8; i += kThreads)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else {
    for (int i = threadIdx.x; i < n; i += kThreads) dst[i] = src[i];
  }
  if (threadIdx.x < bg.NH) {
    const std::size_t hb = static_cast<std::size_t>(bg.b) * bg.H + bg.head0 + threadIdx.x;
    A.rec.alpha[slot * bg.H + bg.head0 + threadIdx.x] = A.in.alpha[hb];
    if (gdn) A.rec.beta[slot * bg.H + bg.head0 + threadIdx.x] = A.in.beta[hb];
  }
}


// The shapes the tensor-core reads (mma_read.cuh) serve: dk = 128, and 16-row tiles that never straddle two
// heads (dv % 16 == 0). Mamba-2 and GDN only (mma_read_applies): KDA's kernels have no tensor-core read.
__host__ __device__ constexpr bool tensor_core_read_serves(int dk, int dv) { return dk == 128 && dv % 16 == 0; }

// 16 bytes global -> shared without registers (cp.async), zero-filled when !valid (src not read). Both
// addresses 16-byte aligned. The flush kernel streams its checkpoint rows this way, the non-flush kernel
// its window's records.
__device__ __forceinline__ void copy_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// The window's record vectors, position-major as stored: vals[p][NH dv] for p < staged,
// Mamba-2's v in bf16 (position h0 is the current token's v) and GDN's cached u in fp32. A ring slot
// holds the block's NH heads' vectors as one contiguous run (decode_kernels.h), as StepInputs::v does,
// so each 16-byte piece needs one address and goes global -> shared by cp.async: no registers, no
// conversion, no per-element index math. (The element-wise staging with index math per piece it
// replaces was the largest of the non-flush block's fixed costs in Nsight Compute, experiments/bench/
// decode_2026-12-04/session11/.) The caller waits for the copies (copy_async_wait_all) before the barrier
// ahead of its fold. Runs that are not 16-byte aligned take an element-wise copy into the same layout.
// Non-flush blocks and the streamed flush (decode_replay_flush.cu, which weights them at use) stage this way.
// kGivenReciprocal: `inv_pieces` is SmallDiv's reciprocal of the pieces a position (NonflushConstants), when it
// is not 0.
template <ssm::Recurrence K, bool kGivenReciprocal = false>
__device__ __forceinline__ void stage_window_records(const ReplayArgs& A, const BlockGeometry& bg, const WindowState& win,
                                                     float* vals, int h0, int staged, float inv_pieces = 0.0f) {
  using V = std::conditional_t<K == ssm::Recurrence::mamba2, __nv_bfloat16, float>;
  constexpr int kPiece = 16 / static_cast<int>(sizeof(V));
  const int run = bg.NH * bg.dv;  // values per position
  V* const dst = reinterpret_cast<V*>(vals);
  const auto src_of = [&](int p) -> const V* {
    if constexpr (K == ssm::Recurrence::mamba2) {
      if (p == h0) return A.in.v + (static_cast<std::size_t>(bg.b) * bg.H + bg.head0) * bg.dv;
      return A.rec.v + (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0) * bg.dv;
    } else {
      return A.rec.u + (ring_slot(A.rec, bg.b, win, p) * bg.H + bg.head0) * bg.dv;
    }
  };
  const auto aligned = [](const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; };
  // Every run starts 16-byte aligned when the bases are and runs, row strides and head offsets are whole pieces.
  const V* const ring = K == ssm::Recurrence::mamba2 ? reinterpret_cast<const V*>(A.rec.v) : reinterpret_cast<const V*>(A.rec.u);
  const bool pieces = run % kPiece == 0 && (bg.H * bg.dv) % kPiece == 0 && (bg.head0 * bg.dv) % kPiece == 0 &&
                      aligned(ring) && aligned(dst) && (K != ssm::Recurrence::mamba2 || aligned(A.in.v));
  if (pieces) {
    const int per_position = run / kPiece;
    // SmallDiv's range (d <= 2^10, x < 2^20 with staged <= 64); a forced wider block divides.
    const bool small = per_position <= 1024;
    const SmallDiv position_of = kGivenReciprocal && inv_pieces > 0.0f ? SmallDiv(SmallDiv::Reciprocal{inv_pieces})
                                                                       : SmallDiv(per_position);
    for (int i = threadIdx.x; i < staged * per_position; i += kThreads) {
      const int p = small ? position_of(i) : i / per_position, piece = i - p * per_position;
      copy_async16(dst + static_cast<std::size_t>(p) * run + piece * kPiece, src_of(p) + piece * kPiece, true);
    }
    copy_async_commit();
  } else {
    for (int i = threadIdx.x; i < staged * run; i += kThreads) {
      const int p = i / run, e = i - p * run;
      dst[i] = src_of(p)[e];
    }
  }
}

// Non-flush grids of at least this many blocks per SM take the wide blocks (decode_replay.cu) and, with
// ReplayConfig::ReadPath::automatic, the tensor-core NVFP4 read (decode_replay_nonflush.cu). Smaller
// grids are latency-bound: there the wide blocks made the staggered step slower (H200, 2026-12-04,
// Qwen3.5-122B at B = 32, 512 blocks: 57.5 us against 52.7 us with 2 heads per block; call 6 of
// experiments/bench/decode_2026-12-04/session11/), and the tensor-core read's B table adds a barrier
// per block that few blocks cannot hide.
constexpr int kLargeGridBlocksPerSm = 4;

// Launches one replay kernel over `grid` with `smem` bytes of dynamic shared memory; `programmatic`:
// as a programmatic dependent launch of the kernel before it in the stream.
template <class Kernel, class... Extra>
void launch_replay_kernel(Kernel kernel, const ReplayArgs& A, dim3 grid, std::size_t smem, bool programmatic,
                          cudaStream_t stream, const Extra&... extra) {
  REPLAYSSM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t launch_config{};
  launch_config.gridDim = grid;
  launch_config.blockDim = dim3(kThreads);
  launch_config.dynamicSmemBytes = smem;
  launch_config.stream = stream;
  launch_config.attrs = programmatic ? &attribute : nullptr;
  launch_config.numAttrs = programmatic ? 1 : 0;
  REPLAYSSM_CUDA_CHECK(cudaLaunchKernelEx(&launch_config, kernel, A, extra...));
}

// The non-flush kernel for the read checkpoint's format (decode_replay_nonflush.cu) and the flush
// kernel for the recurrence checkpoint's format (decode_replay_flush.cu).
void launch_replay_nonflush(ssm::Recurrence kind, StorageFormat read, const ReplayArgs& A, dim3 grid, cudaStream_t stream);
void launch_replay_flush(ssm::Recurrence kind, StorageFormat recur, const ReplayArgs& A, dim3 grid, cudaStream_t stream);

}  // namespace replayssm::cuda::decode_detail
