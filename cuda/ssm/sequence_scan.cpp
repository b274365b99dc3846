// Host side of the layer scan: the CPU twin's argument checks, the GPU's own limits, and the
// translation of the PrecisionPolicy into the kernels' arguments.
#include "ssm/sequence_scan.h"

#include <fmt/format.h>

#include <stdexcept>

#include "ssm/sequence_scan_kernel.h"

namespace replayssm::cuda {

std::string scan_unsupported_reason(const ssm::PrecisionPolicy& policy) {
  if (policy.uses_rounding(formats::Rounding::ef))
    return fmt::format("policy {} rounds by error feedback (+ef), which the GPU scan kernels do not implement yet "
                       "(the CPU reference does)",
                       policy.to_string());
  if (policy.skip.mode != ssm::CheckpointSkip::Mode::off)
    return fmt::format("policy {} skips checkpoint reads (appendix F), which the GPU scan kernels do not implement "
                       "yet (the CPU reference does)",
                       policy.to_string());
  return {};
}

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
  a.recur_mode = formats::element_rounding_mode(policy.recur.rounding);
  a.read_format = split ? policy.read.format : formats::StorageFormat::fp32;
  a.read_mode = formats::element_rounding_mode(policy.read.rounding);
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
  detail::launch_sequence_scan(a, stream);
}

}  // namespace replayssm::cuda
