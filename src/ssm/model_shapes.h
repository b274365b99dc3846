// The four hybrid models of the paper (REPLAYSSM.md section 8) and one KDA model beyond it, as data,
// for the analytic models (ssm/analytic_model.h), `replayssm traffic` and the benchmarks.
//
//   short name            model                        SSM      SSM/attn  key  value  dk   dv
//   nemotron-3-nano-4b    Nemotron-3-Nano-4B           Mamba-2  21 / 4    8    96     128  80
//   nemotron-3-super      Nemotron-3-Super-120B-A12B   Mamba-2  40 / 8    8    128    128  64
//   qwen3.5-4b            Qwen3.5-4B                   GDN      24 / 8    16   32     128  128
//   qwen3.5-122b-a10b     Qwen3.5-122B-A10B            GDN      36 / 12   16   64     128  128
//   kimi-linear-48b-a3b   Kimi-Linear-48B-A3B          KDA      20 / 7    32   32     128  128
//
// Kimi Linear is not in the paper (REPLAYSSM.md section 1: KDA "beyond the paper"); its row is the
// published config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct: 27 layers, linear_attn_config
// kda_layers (20) and full_attn_layers 4, 8, ..., 24, 27 (7, MLA), num_heads 32, head_dim 128 (one
// key head per value head, dk = dv = 128).
//
// KV-cache bytes per token per attention layer (for the SSM-vs-attention crossover) are known
// from the paper for Nemotron-3-Super only (appendix C.2: 2 KV heads x 128 x {K,V} x 1 B FP8 =
// 512 B). The paper gives no attention shape for the other three; they carry no default and the
// caller must supply the value (`replayssm traffic --kv-bytes-per-token N`); Kimi Linear's MLA
// neither (its note says what its config implies).
#pragma once
#include <optional>
#include <span>
#include <string_view>

#include "ssm/sequence_emulator.h"  // ssm::Recurrence

namespace replayssm::ssm {

struct ModelShape {
  std::string_view short_name;  // lookup key, e.g. "nemotron-3-super"
  std::string_view name;        // the paper's name, e.g. "Nemotron-3-Super-120B-A12B"
  Recurrence kind = Recurrence::mamba2;
  int ssm_layers = 0;
  int attention_layers = 0;
  int key_heads = 0;    // per SSM layer (Mamba-2: n_groups; GDN: num_k_heads)
  int value_heads = 0;  // per SSM layer; each owns one dv x dk state
  int dk = 0;
  int dv = 0;
  // KV-cache bytes per token per attention layer; empty when the paper does not give it.
  std::optional<double> kv_bytes_per_token;
  std::string_view kv_note;  // where kv_bytes_per_token comes from (or why it is missing)
};

// The five shapes, in the order of the table above (the paper's four, then Kimi Linear).
std::span<const ModelShape> paper_shapes();

// Lookup by short name or by the paper's full name, case-insensitive. Throws
// std::invalid_argument listing the known short names.
const ModelShape& find_shape(std::string_view name);

// Display name of a recurrence: "Mamba-2", "GDN", "KDA".
std::string_view recurrence_name(Recurrence kind);

}  // namespace replayssm::ssm
