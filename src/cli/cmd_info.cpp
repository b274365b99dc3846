// replayssm info MODEL_DIR: architecture, layer pattern, SSM head shapes and parameter count of a
// Hugging Face checkpoint. Validates config.json and every tensor's presence, dtype and shape
// without converting weight data (each tensor is only scanned in place for NaN and Inf, which
// are listed by tensor), so it stays cheap on large checkpoints. Quantized-weight checkpoints (FP8
// block-scaled, ModelOpt NVFP4) are checked the same way: the quantized matrices, their format,
// stored size and FP32 size are listed (model/quantized_weights.h). The forward's memory is
// estimated at a few lengths, or at --length N, for --threads worker threads.
#include <charconv>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "io/text_source.h"
#include "model/causal_lm.h"

namespace replayssm::cli {
namespace {

struct InfoOptions {
  std::string dir, length;
  int threads = 0;
};

// All of `text` as a decimal integer in [1, 2^40], or an error naming the option.
int64_t parse_length(const std::string& text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < 1 || v > io::kMaxLength)
    throw std::runtime_error(
        fmt::format("info: --length '{}' is not a positive integer up to 2^40 = {}", text, io::kMaxLength));
  return v;
}

}  // namespace

void register_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "info",
      "Describe a Hugging Face checkpoint directory (config.json + model.safetensors or sharded index):\n"
      "architecture, layer pattern (M Mamba-2, G Gated DeltaNet, K Kimi Delta Attention, * attention,\n"
      "- MLP, E mixture of experts), SSM head shapes\n"
      "(key heads, value heads, dk, dv), parameter count and the tensors holding NaN or Inf, if any.\n"
      "Supported model_type: mamba2, nemotron_h, qwen3_5 / qwen3_5_text, qwen3_5_moe / qwen3_5_moe_text,\n"
      "kimi_linear. Quantized weights (FP8 E4M3\n"
      "block-scaled, quant_method fp8; NVFP4, ModelOpt) are dequantized to FP32 when read: info lists\n"
      "which matrices, their format and the memory they take. Expert weights stay in the memory-mapped\n"
      "files and are converted one expert per worker thread at a time; the memory estimate counts them so.");
  cmd->add_option("MODEL_DIR", o->dir, "model directory")->required();
  CLI::Option* length_option = cmd->add_option("--length", o->length,
                  "estimate the forward's memory for N positions, 1 to 2^40 (default: N = 4096, 32768, 131072)");
  cmd->add_option("--threads", o->threads, "worker threads of the forward to estimate for (0: all hardware threads)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->callback([o, length_option] {
    std::optional<int64_t> length;
    if (length_option->count()) length = parse_length(o->length);
    const model::CausalLM lm = model::CausalLM::inspect(o->dir);
    std::cout << (length ? lm.describe({*length}, o->threads) : lm.describe({4096, 32768, 131072}, o->threads));
  });
}

}  // namespace replayssm::cli
