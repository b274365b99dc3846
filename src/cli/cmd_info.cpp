// replayssm info MODEL_DIR: architecture, layer pattern, SSM head shapes and parameter count of a
// Hugging Face checkpoint. Validates config.json and every tensor's presence, dtype and shape
// without converting weight data (each tensor is only scanned in place for NaN and Inf, which
// are listed by tensor), so it stays cheap on large checkpoints. Quantized-weight checkpoints (FP8
// block-scaled, ModelOpt NVFP4) are checked the same way: the quantized matrices, their format,
// stored size and FP32 size are listed (model/quantized_weights.h).
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "model/causal_lm.h"

namespace replayssm::cli {

void register_info(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "info",
      "Describe a Hugging Face checkpoint directory (config.json + model.safetensors or sharded index):\n"
      "architecture, layer pattern (M Mamba-2, G Gated DeltaNet, K Kimi Delta Attention, * attention,\n"
      "- MLP, E mixture of experts), SSM head shapes\n"
      "(key heads, value heads, dk, dv), parameter count and the tensors holding NaN or Inf, if any.\n"
      "Supported model_type: mamba2, nemotron_h, qwen3_5 / qwen3_5_text, qwen3_5_moe / qwen3_5_moe_text,\n"
      "kimi_linear. Quantized weights (FP8 E4M3\n"
      "block-scaled, quant_method fp8; NVFP4, ModelOpt) are dequantized to FP32 at load: info lists\n"
      "which matrices, their format and the memory they take.");
  cmd->add_option("MODEL_DIR", *dir, "model directory")->required();
  cmd->callback([dir] { std::cout << model::CausalLM::inspect(*dir).describe(); });
}

}  // namespace replayssm::cli
