// ReplaySSM standard decode for KDA (Algorithm 4 with channel-wise decays; Algorithm 3 with a separate
// low-precision read checkpoint): the non-flush kernel (output-only form from the read checkpoint,
// decode_kda_replay_nonflush.cu) and the flush kernel (REPLAY from the recur checkpoint, writing it and,
// split, the LP copy, decode_kda_replay_flush.cu), launched over (value head, sequence) blocks (the flush
// kernel's rows: every sequence, or ReplayConfig::flush_list's), the flush kernel first and the non-flush
// kernel as its programmatic dependent, as decode_replay.cu does for Mamba-2 and GDN. Window bookkeeping
// (WindowState, ring slots, the flush test h + 1 >= L) is the same as theirs, so commit_step and
// verify_step share the ring. Both kernels also implement error feedback on the copies they write (+ef)
// and appendix F's decay-based checkpoint-read skipping.
#include "ssm/decode_kda.cuh"

namespace replayssm::cuda {

using formats::StorageFormat;
using namespace detail;
using namespace decode_detail;

void kda_detail::replay_step(const DecodeShape& shape, const StepInputs& in, const ReplayConfig& config,
                             DeviceRecords& records, cudaStream_t stream) {
  check_shape(shape);
  check_kda_inputs(in, config.heads_per_block);
  check_kda_records(records);
  if (config.window < 1 || config.window > kMaxWindow)
    throw_invalid_argument("kda replay decode supports 1 <= L <= 64 (ReplayConfig::window)", "L", config.window);
  if (records.max_drafts < 0) throw_invalid_argument("record ring: max_drafts must be >= 0", "max_drafts", records.max_drafts);
  // A ring that serves verification (max_drafts = T > 0) can hold up to max(L, T) committed records
  // when a standard step comes: that flush folds max(L, T) + 1 of them.
  const int stage = records.max_drafts > 0 ? std::max(config.window, records.max_drafts) + 1 : config.window;
  if (stage > kMaxWindow)
    throw_invalid_argument("kda replay decode after verification supports max(L, T) + 1 <= 64", "L", config.window, "T",
                           records.max_drafts);
  const int min_capacity = records.max_drafts > 0 ? std::max(config.window, records.max_drafts) + records.max_drafts : config.window;
  if (records.capacity < min_capacity)
    throw_invalid_argument("record ring needs capacity L, or max(L, T) + T with max_drafts = T (DeviceRecords::capacity)",
                           "capacity", records.capacity, "needed", min_capacity);
  if (config.recur.payload == nullptr) throw std::invalid_argument("kda replay decode: ReplayConfig::recur.payload is required");
  if (config.recur.format != StorageFormat::fp32 && config.recur.format != StorageFormat::fp16)
    throw std::invalid_argument("kda replay decode: ReplayConfig::recur.format (the recurrence checkpoint) must be fp32 or fp16");
  const StorageFormat read = config.split() ? config.read.format : config.recur.format;
  if (read != StorageFormat::fp32 && read != StorageFormat::fp16 && read != StorageFormat::bf16 &&
      read != StorageFormat::fp8b128 && read != StorageFormat::nvfp4)
    throw std::invalid_argument("kda replay decode: ReplayConfig::read.format must be fp32, fp16, bf16, fp8b128 or nvfp4");
  if (read == StorageFormat::fp8b128 && shape.dk % 128)
    throw_invalid_argument("kda replay decode: an fp8b128 read checkpoint needs dk % 128 == 0", "dk", shape.dk);
  // The NVFP4 LP copy needs the tensor amax before encoding; the flush re-reads the rows from the
  // recur checkpoint it just wrote, which holds S itself only when the recur copy is fp32.
  if (config.split() && read == StorageFormat::nvfp4 && config.recur.format != StorageFormat::fp32)
    throw std::invalid_argument("kda replay decode: an NVFP4 read checkpoint needs an fp32 recurrence checkpoint");
  check_flush_list(config, shape);
  ReplayArgs A = make_replay_args(shape, in, config, records, 1, stage);
  // With a flush list the flush grid's rows are the listed sequences only (ReplayConfig::flush_list).
  const dim3 grid(shape.value_heads, shape.batch), flush_grid(shape.value_heads, A.flush_list ? A.flush_count : shape.batch);
  A.nonflush_blocks = A.flush_blocks = shape.value_heads;
  // The flush kernel first, as a plain launch; the non-flush kernel follows as its programmatic
  // dependent, so its blocks start while the flush kernel's last ones still run (the two touch
  // disjoint sequences; decode_replay.cu says why this order).
  if (flush_kernel_launched(A)) launch_kda_flush(config.recur.format, A, flush_grid, stream);
  launch_kda_nonflush(read, A, grid, stream);
  REPLAYSSM_CUDA_CHECK_LAUNCH();
  advance_host_parity(records);
}

}  // namespace replayssm::cuda
