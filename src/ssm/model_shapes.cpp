#include "ssm/model_shapes.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace replayssm::ssm {
namespace {

constexpr std::string_view kNoKvNote =
    "not given by the paper: pass --kv-bytes-per-token (bytes of K and V per token per attention layer)";

const std::array<ModelShape, 5> kShapes = {{
    {"nemotron-3-nano-4b", "Nemotron-3-Nano-4B", Recurrence::mamba2, 21, 4, 8, 96, 128, 80, std::nullopt, kNoKvNote},
    {"nemotron-3-super", "Nemotron-3-Super-120B-A12B", Recurrence::mamba2, 40, 8, 8, 128, 128, 64, 512.0,
     "paper C.2: 2 KV heads x 128 x {K,V} x 1 B (FP8) = 512 B"},
    {"qwen3.5-4b", "Qwen3.5-4B", Recurrence::gdn, 24, 8, 16, 32, 128, 128, std::nullopt, kNoKvNote},
    {"qwen3.5-122b-a10b", "Qwen3.5-122B-A10B", Recurrence::gdn, 36, 12, 16, 64, 128, 128, std::nullopt, kNoKvNote},
    // Beyond the paper: KDA (channel-wise decay), config.json of Kimi-Linear-48B-A3B-Instruct.
    {"kimi-linear-48b-a3b", "Kimi-Linear-48B-A3B", Recurrence::kda, 20, 7, 32, 32, 128, 128, std::nullopt,
     "not given by the paper (Kimi Linear's MLA caches a latent of kv_lora_rank 512 + qk_rope_head_dim 64 values per "
     "token, 1,152 B in bf16, per its config.json): pass --kv-bytes-per-token"},
}};

bool iequal(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::span<const ModelShape> paper_shapes() { return kShapes; }

const ModelShape& find_shape(std::string_view name) {
  for (const ModelShape& s : kShapes)
    if (iequal(name, s.short_name) || iequal(name, s.name)) return s;
  std::string known;
  for (const ModelShape& s : kShapes) known += fmt::format("{}{}", known.empty() ? "" : ", ", s.short_name);
  throw std::invalid_argument(fmt::format("unknown model shape '{}': expected one of {}", name, known));
}

std::string_view recurrence_name(Recurrence kind) {
  switch (kind) {
    case Recurrence::mamba2: return "Mamba-2";
    case Recurrence::gdn: return "GDN";
    case Recurrence::kda: return "KDA";
  }
  return "?";
}

}  // namespace replayssm::ssm
