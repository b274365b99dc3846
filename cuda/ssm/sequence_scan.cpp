// Host side of the layer scan: the CPU twin's argument checks, the GPU's own limits, and the
// translation of the PrecisionPolicy into the kernels' arguments.
#include "ssm/sequence_scan.h"

#include <fmt/format.h>

#include <stdexcept>

#include "cuda_check.h"
#include "ssm/sequence_scan_kernel.h"

namespace replayssm::cuda {

std::string scan_unsupported_reason(const ssm::PrecisionPolicy& policy) {
  (void)policy;  // every scheme, format, rounding (rtn, sr, ef) and skip mode has a GPU scan
  return {};
}

namespace {

// The kernels' element rounding of a stored copy: error feedback rounds y = x + residual to
// nearest (formats::fake_quantize_with_error_feedback), the residual handled beside it.
formats::RoundingMode kernel_rounding(const ssm::StateFormat& f) {
  return f.rounding == formats::Rounding::ef ? formats::RoundingMode::nearest_even
                                             : formats::element_rounding_mode(f.rounding);
}

bool uses_error_feedback(const ssm::StateFormat& f) {
  return f.rounding == formats::Rounding::ef && f.format != formats::StorageFormat::fp32;  // fp32 stores exactly
}

}  // namespace

void emulate_layer_sequence_gpu(const ssm::LayerSequence& seq, const ssm::PrecisionPolicy& policy, uint32_t layer,
                                cudaStream_t stream, ScanCheckpoints* checkpoints) {
  ssm::check_layer_sequence(seq, policy, layer);
  if (const std::string why = scan_unsupported_reason(policy); !why.empty())
    throw std::invalid_argument("emulate_layer_sequence_gpu: " + why);
  if (seq.dk > kScanMaxDk || seq.dv > kScanMaxDv)
    throw std::invalid_argument(fmt::format(
        "emulate_layer_sequence_gpu: head dims dk = {}, dv = {}: the scan kernels support dk <= {} and dv <= {}",
        seq.dk, seq.dv, kScanMaxDk, kScanMaxDv));
  const bool split = policy.scheme == ssm::DecodeScheme::split;
  const int64_t events = static_cast<int64_t>(ssm::quantization_events(policy, seq.n_tokens));
  if (checkpoints) {
    if (checkpoints->events != events)
      throw std::invalid_argument(fmt::format(
          "emulate_layer_sequence_gpu: checkpoint buffers hold {} events per head, the policy {} makes {} over {} tokens",
          checkpoints->events, policy.to_string(), events, seq.n_tokens));
    if (events > 0 && checkpoints->recur == nullptr)
      throw std::invalid_argument("emulate_layer_sequence_gpu: checkpoints given without a recur buffer");
    if (events > 0 && (checkpoints->read == nullptr) == split)
      throw std::invalid_argument(split ? "emulate_layer_sequence_gpu: a split policy needs a read checkpoint buffer"
                                        : "emulate_layer_sequence_gpu: a read checkpoint buffer is for split policies only");
  }
  if (seq.n_tokens == 0) return;

  detail::ScanKernelArgs a;
  a.kind = seq.kind;
  a.scheme = policy.scheme == ssm::DecodeScheme::conventional ? detail::ScanScheme::conventional
             : split                                          ? detail::ScanScheme::split
                                                              : detail::ScanScheme::shared;
  a.recur_format = policy.recur.format;
  a.recur_mode = kernel_rounding(policy.recur);
  a.read_format = split ? policy.read.format : formats::StorageFormat::fp32;
  a.read_mode = split ? kernel_rounding(policy.read) : formats::RoundingMode::nearest_even;
  a.seed = policy.seed;
  a.layer = layer;
  a.n_tokens = seq.n_tokens;
  a.dk = seq.dk;
  a.dv = seq.dv;
  a.n_value_heads = seq.n_value_heads;
  a.heads_per_group = seq.n_value_heads / seq.n_key_heads;
  a.window = policy.window;
  a.q = seq.q, a.k = seq.k, a.alpha = seq.alpha, a.beta = seq.beta, a.v = seq.v, a.out = seq.out;
  a.ld_q = seq.ld_q, a.ld_k = seq.ld_k, a.ld_alpha = seq.ld_alpha, a.ld_beta = seq.ld_beta, a.ld_v = seq.ld_v;
  a.ld_out = seq.ld_out;
  if (checkpoints && events > 0) {
    a.checkpoint_recur = checkpoints->recur;
    a.checkpoint_read = checkpoints->read;
    a.checkpoint_events = events;
  }
  if (policy.skip.mode != ssm::CheckpointSkip::Mode::off) {
    a.skip = true;
    a.skip_threshold_read = policy.skip.threshold_for(split ? policy.read : policy.recur);
    a.skip_threshold_flush = policy.skip.threshold_for(policy.recur);
    if (checkpoints) a.skip_counts = checkpoints->skip_counts;
  } else if (checkpoints && checkpoints->skip_counts) {
    throw std::invalid_argument("emulate_layer_sequence_gpu: skip counts asked of policy " + policy.to_string() +
                                ", which does not skip");
  }
  // Error-feedback residuals start at zero (ssm::error_feedback_residual), one buffer per ef copy,
  // stream-ordered so the call stays asynchronous.
  const bool recur_ef = uses_error_feedback(policy.recur), read_ef = split && uses_error_feedback(policy.read);
  const std::size_t residual_bytes =
      static_cast<std::size_t>(seq.n_value_heads) * static_cast<std::size_t>(seq.dv) * static_cast<std::size_t>(seq.dk) *
      sizeof(float);
  float* residuals = nullptr;
  const int n_residuals = int{recur_ef} + int{read_ef};
  if (n_residuals > 0) {
    REPLAYSSM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&residuals), n_residuals * residual_bytes, stream));
    REPLAYSSM_CUDA_CHECK(cudaMemsetAsync(residuals, 0, n_residuals * residual_bytes, stream));
    float* next = residuals;
    if (recur_ef) a.residual_recur = next, next += residual_bytes / sizeof(float);
    if (read_ef) a.residual_read = next;
  }
  try {
    detail::launch_sequence_scan(a, stream);
  } catch (...) {
    if (residuals) (void)cudaFreeAsync(residuals, stream);
    throw;
  }
  if (residuals) REPLAYSSM_CUDA_CHECK(cudaFreeAsync(residuals, stream));
}

}  // namespace replayssm::cuda
