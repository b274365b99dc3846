// One ReplaySSM standard decode step (Algorithms 1, 4): the flush kernel for the sequences whose window is
// full, and beside it the non-flush kernel for the others; each sequence's window state advances.
#include "ssm/decode_replay.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

namespace {

constexpr int kMaxNonflushRows = 512;

// Heads per non-flush block when the launcher chooses: the most that divide the heads per key head with
// at most kMaxNonflushRows rows (twice that for an NVFP4 read), a grid of at least kLargeGridBlocksPerSm
// blocks per SM, and 3 blocks' shared memory within what one block may have; never fewer than `narrow`
// (the flush kernel's choice, heads_per_block). `bf16_records` (out): whether the blocks size their staged
// records as bf16 (bf16_sized_records), which they do only where that fits more heads than the fp32 sizing
// or, for the Mamba-2 NVFP4 tensor-core read with appendix F skipping (`skip_read`), room for its 4 blocks per SM:
// elsewhere the smaller room alone cost Nemotron-3-Super's NVFP4 read 1.5-2% (H100, B = 64, session 28).
struct NonflushBlocks {
  int heads = 0;
  bool bf16_records = false;
};
NonflushBlocks nonflush_heads_per_block(ssm::Recurrence kind, const DecodeShape& s, int L, int narrow, StorageFormat read,
                                        bool skip_read) {
  const int max_rows = read == StorageFormat::nvfp4 ? 2 * kMaxNonflushRows : kMaxNonflushRows;
  const long min_blocks = static_cast<long>(kLargeGridBlocksPerSm) * sm_count();
  auto widest = [&](bool bf16_records, int blocks_per_sm) {
    int best = narrow;
    for (int nh = narrow + 1; nh <= s.heads_per_group(); ++nh) {
      // GDN's FP8 tensor-core read also stages its rows' block scales (mma_read.cuh); counted for any FP8 read.
      const std::size_t smem =
          sizeof(float) * (replay_shared_floats(L, s.dk, s.dv, nh, false, bf16_records) +
                           (read == StorageFormat::fp8b128 ? static_cast<std::size_t>(nh) * s.dv : 0));
      if (s.heads_per_group() % nh == 0 && nh * s.dv <= max_rows &&
          static_cast<long>(s.batch) * s.value_heads / nh >= min_blocks && blocks_per_sm * smem <= max_dynamic_smem())
        best = nh;
    }
    return best;
  };
  const int fp32_sized = widest(false, 3);
  if (bf16_sized_records(kind, read)) {
    // Where the grid is large enough for the tensor-core read and it skips (its skipping instance runs 4 blocks
    // per SM: nonflush_min_blocks), bf16 records and room for 4 blocks, as long as that keeps the heads the fp32
    // sizing gave.
    const int four_blocks = widest(true, 4);
    if (skip_read && tensor_core_read_serves(s.dk, s.dv) && four_blocks >= fp32_sized &&
        static_cast<long>(s.batch) * s.value_heads / four_blocks >= min_blocks)
      return {four_blocks, true};
    const int bf16_sized = widest(true, 3);
    if (bf16_sized > fp32_sized) return {bf16_sized, true};
  }
  return {fp32_sized, false};
}

}  // namespace

bool tensor_core_read_exists(ssm::Recurrence kind, StorageFormat read, int dk, int dv) {
  // As mma_read_applies (mma_read.cuh) and tensor_core_read_serves.
  const bool format = read == StorageFormat::nvfp4 || (read == StorageFormat::fp8b128 && kind == ssm::Recurrence::gdn);
  return kind != ssm::Recurrence::kda && format && tensor_core_read_serves(dk, dv);
}

void replay_step(ssm::Recurrence kind, const DecodeShape& shape, const StepInputs& in, const ReplayConfig& config,
                 DeviceRecords& records, cudaStream_t stream) {
  // A forced tensor-core read where there is none is refused rather than run on the CUDA cores: a study of
  // that path's numerics must not silently measure the other one.
  const StorageFormat read_format = config.split() ? config.read.format : config.recur.format;
  if ((read_format == StorageFormat::nvfp4 || read_format == StorageFormat::fp8b128) &&
      config.read_path == ReplayConfig::ReadPath::tensor_cores &&
      !tensor_core_read_exists(kind, read_format, shape.dk, shape.dv))
    throw_invalid_argument(kind == ssm::Recurrence::kda ? "read_path = tensor_cores: the KDA kernels have no tensor-core read"
                           : read_format == StorageFormat::fp8b128 && kind == ssm::Recurrence::mamba2
                               ? "read_path = tensor_cores: the FP8-b128 read has tensor cores for GDN only"
                               : "read_path = tensor_cores: the tensor-core reads serve dk = 128 with dv % 16 == 0",
                           "dk", shape.dk, "dv", shape.dv);
  if (config.flush_heads_per_block < 0)
    throw_invalid_argument("flush_heads_per_block must be >= 0 (0: the launcher's choice)", "flush_heads_per_block",
                           config.flush_heads_per_block);
  if (kind == ssm::Recurrence::kda) {
    if (config.flush_heads_per_block != 0)
      throw_invalid_argument("flush_heads_per_block: the KDA kernels take heads_per_block only", "flush_heads_per_block",
                             config.flush_heads_per_block);
    return kda_detail::replay_step(shape, in, config, records, stream);
  }
  check_shape(shape);
  if (config.window < 1 || config.window > kMaxWindow)
    throw_invalid_argument("replay decode supports 1 <= L <= 64", "L", config.window);
  // A ring that serves verification (max_drafts = T > 0) can hold up to max(L, T) committed records
  // when a standard step comes: that flush folds max(L, T) + 1 of them.
  const int stage = records.max_drafts > 0 ? std::max(config.window, records.max_drafts) + 1 : config.window;
  if (records.max_drafts < 0) throw_invalid_argument("record ring: max_drafts must be >= 0", "max_drafts", records.max_drafts);
  if (stage > kMaxWindow)
    throw_invalid_argument("replay decode after verification supports max(L, T) + 1 <= 64", "L", config.window, "T",
                           records.max_drafts);
  const int min_capacity = records.max_drafts > 0 ? std::max(config.window, records.max_drafts) + records.max_drafts : config.window;
  if (records.capacity < min_capacity)
    throw_invalid_argument("record ring needs capacity L, or max(L, T) + T with max_drafts = T", "capacity", records.capacity,
                           "needed", min_capacity);
  if (read_format == StorageFormat::fp8b128 && shape.dk % 128) throw std::invalid_argument("fp8b128 read needs dk % 128 == 0");
  // The NVFP4 LP copy needs the tensor amax before encoding; the flush re-reads the rows from the
  // recur (HP) checkpoint it just wrote, which holds S itself only when the recur copy is fp32.
  if (config.split() && read_format == StorageFormat::nvfp4 && config.recur.format != StorageFormat::fp32)
    throw std::invalid_argument("an NVFP4 read checkpoint needs an fp32 recurrence checkpoint in the kernels");
  // This step's kernels loop over the block's (head, row) pairs, so a forced NH may exceed 256 rows;
  // the flush block's shared memory (the window's keys and every head's records) must still fit.
  auto check_flush_smem = [&](int nh, const char* option) {
    const std::size_t flush_smem = sizeof(float) * replay_shared_floats(stage, shape.dk, shape.dv, nh, true, false);
    if (flush_smem > max_dynamic_smem())
      throw_invalid_argument((std::string("replay decode: ") + option +
                              " too large for shared memory (the flush block stages the window for every head)")
                                 .c_str(),
                             option, nh, "bytes", static_cast<long>(flush_smem));
  };
  const int NH = heads_per_block(shape, config.heads_per_block, kMaxReplayRows);
  check_flush_smem(NH, "heads_per_block");
  // The flush kernel gets its own heads per block. Its blocks work only for the sequences that flush
  // (with staggered windows B / L of them; the blocks of the others return at once), so at small B a
  // few blocks carry the whole flush while the non-flush grid is short. Fewer heads per flush block
  // spread that work; but each returning block costs too (measured, H200, 2026-12-04: the non-flush
  // step of Nemotron-3-Super at B = 256 took 294 / 305 / 329 us with 8192 / 16384 / 32768 flush
  // blocks). So: the fewest heads per block whose flush grid stays within kMaxFlushBlocksPerSm blocks
  // per SM, else the non-flush kernel's NH (experiments/bench/decode_2026-12-04/call4_flush_grid/).
  // The rule counts B rows with a flush list too: choosing by the list's rows (fewer heads per block on its
  // smaller grid) made the staggered step of Nemotron-3-Super 6% slower at B = 64 and 128 (H100, 2026-12-06,
  // experiments/bench/decode_2026-12-06/session25/).
  constexpr long kMaxFlushBlocksPerSm = 12;
  int NH_flush = NH;
  if (config.flush_heads_per_block > 0) {  // forced for the flush kernel alone (ReplayConfig::flush_heads_per_block)
    NH_flush = heads_per_block(shape, config.flush_heads_per_block, kMaxReplayRows, "flush_heads_per_block");
    check_flush_smem(NH_flush, "flush_heads_per_block");
  } else if (config.heads_per_block == 0)
    for (int nh = 1; nh < NH; ++nh)
      if (shape.heads_per_group() % nh == 0 &&
          static_cast<long>(shape.batch) * (shape.value_heads / nh) <= kMaxFlushBlocksPerSm * sm_count()) {
        NH_flush = nh;
        break;
      }
  // The non-flush kernel gets wider blocks, up to kMaxNonflushRows (head, row) pairs: its per-block work
  // (geometry, key products, decay weights, the B table of the tensor-core read) is then shared by more
  // rows. Measured on the H200 (2026-12-04, Nemotron-3-Super, B = 256, L = 16, 8 against 4 heads per
  // block, 75f8378's kernels): the NVFP4 / FP8 / FP16 reads 1.21x / 1.15x / 1.10x faster, the FP32 read
  // 1% slower; 16 heads (1,024 rows) made the FP32 read 1.14x slower (experiments/bench/decode_2026-12-04/
  // session11/). The NVFP4 read, issue-bound, gains from 1,024 rows (H100, 2026-12-06, B = 256: Nano's read
  // 0.880x the time with 12 heads; FP16 and FP8 lost 5-8% on Super: decode_2026-12-06/session22/). Only while the
  // grid keeps kLargeGridBlocksPerSm blocks per SM and 3 blocks fit one SM's shared memory: at L = 16 Super's NVFP4
  // read got 16 heads only once its records were sized as bf16 (bf16_sized_records; before, 8: session 28).
  const NonflushBlocks wide = config.heads_per_block > 0 ? NonflushBlocks{NH, false}
                                                         : nonflush_heads_per_block(kind, shape, config.window, NH, read_format,
                                                                                   config.skip_threshold_read > 0.0f);
  const int NH_read = wide.heads;
  check_flush_list(config, shape);
  if (config.flush_list && kind == ssm::Recurrence::gdn && config.skip_threshold_read > 0.0f)
    throw std::invalid_argument("replay decode: GDN with skip_threshold_read > 0 takes no ReplayConfig::flush_list (its "
                                "flush kernel also serves the skipped reads of the sequences that do not flush)");
  ReplayArgs A = make_replay_args(shape, in, config, records, NH_read, stage);
  // With a flush list the flush grid's rows are the listed sequences only (ReplayConfig::flush_list).
  const dim3 grid(shape.value_heads / NH_read, shape.batch),
      flush_grid(shape.value_heads / NH_flush, A.flush_list ? A.flush_count : shape.batch);
  A.nonflush_blocks = grid.x;
  A.bf16_records = wide.bf16_records;
  A.flush_blocks = flush_grid.x;
  ReplayArgs A_flush = A;
  A_flush.heads_per_block = NH_flush;
  // The flush kernel first, the non-flush kernel as its programmatic dependent: they work on disjoint
  // sequences, so the second may start as soon as every block of the first has started. In the other
  // order the flush (latency-bound, 1/L of the sequences) could start only once the last wave of the
  // non-flush grid was resident, and ran almost alone: Nsight Compute on Nemotron-3-Super, B = 256,
  // L = 16 gave 258 us + 71 us for the two kernels where the staggered step took 327.5 us. (What
  // follows in the stream still waits for both.)
  if (flush_kernel_launched(A)) launch_replay_flush(kind, config.recur.format, A_flush, flush_grid, stream);
  launch_replay_nonflush(kind, read_format, A, grid, stream);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  advance_host_parity(records);
}

}  // namespace replayssm::cuda
