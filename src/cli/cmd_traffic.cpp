// replayssm traffic: the analytic models of the paper's appendix C for one model shape (or all five):
// memory traffic per window (conventional vs ReplaySSM, records included), FLOPs and arithmetic
// intensity, the optimal window L*, the SSM-vs-attention crossover context, low-precision read
// checkpoints, and (with --drafts) speculative verification against the prior recovery schemes.
#include <cmath>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "formats/quantized_matrix.h"
#include "ssm/analytic_model.h"
#include "ssm/model_shapes.h"
#include "ssm/precision_policy.h"

namespace replayssm::cli {
namespace {

using formats::StorageFormat;
using ssm::ModelShape;

struct TrafficOptions {
  std::string shape;
  int window = 16;
  std::string state_format = "fp32";
  int drafts = 0;
  std::optional<double> accepted;
  std::optional<double> kv_bytes_per_token;
};

// 1234567 -> "1,234,567" (rounded to an integer); beyond the range of long long (or not finite),
// scientific notation.
std::string group(double value) {
  if (!(std::fabs(value) < 9.2e18)) return fmt::format("{:.4g}", value);
  const long long v = std::llround(value);
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

// Binary-prefixed size, e.g. "4 MiB", "8.25 KiB".
std::string binary(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024.0 && u < 4) bytes /= 1024.0, ++u;
  if (u == 0) return fmt::format("{} B", group(bytes));
  return fmt::format("{:.4g} {}", bytes, units[u]);
}

struct Validated {
  StorageFormat state_format;
  double accepted = 0;  // meaningful when drafts > 0
};

Validated validate(const TrafficOptions& o) {
  // Larger windows would overflow the 64-bit byte counts (records ~ L^2 / 2 x r).
  if (o.window < 1 || o.window > ssm::kMaxWindow)
    throw std::invalid_argument(
        fmt::format("--window L must be an integer in [1, {}] (got {})", ssm::kMaxWindow, o.window));
  if (o.drafts < 0) throw std::invalid_argument(fmt::format("--drafts T must be >= 0 (got {})", o.drafts));
  Validated v{};
  try {
    v.state_format = formats::parse_storage_format(o.state_format);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("--state-format: {}", e.what()));
  }
  if (o.drafts == 0) {
    if (o.accepted) throw std::invalid_argument("--accepted needs --drafts T >= 1");
  } else {
    v.accepted = o.accepted.value_or(static_cast<double>(o.drafts));
    if (!(v.accepted >= 1.0) || !std::isfinite(v.accepted))
      throw std::invalid_argument(fmt::format("--accepted A must be >= 1 (got {})", v.accepted));
    if (v.accepted > o.drafts)
      throw std::invalid_argument(
          fmt::format("--accepted A = {} exceeds --drafts T = {}: at most T drafts can be accepted", v.accepted, o.drafts));
    if (o.drafts > o.window)
      throw std::invalid_argument(fmt::format(
          "--drafts T = {} exceeds --window L = {}: the flush test h + T > L would fire on every verify step",
          o.drafts, o.window));
  }
  if (o.kv_bytes_per_token && !(*o.kv_bytes_per_token > 0 && std::isfinite(*o.kv_bytes_per_token)))
    throw std::invalid_argument(
        fmt::format("--kv-bytes-per-token must be a finite number > 0 (got {})", *o.kv_bytes_per_token));
  return v;
}

void print_shape(const ModelShape& s, const TrafficOptions& o, const Validated& v) {
  using namespace ssm;
  const int L = o.window;
  const StorageFormat sf = v.state_format;
  const std::string sf_name(formats::to_string(sf));
  const uint64_t M = state_bytes(s.dv, s.dk, sf);
  const uint64_t r = record_bytes(s.kind, false, s.dv, s.dk);
  const double nv = s.value_heads;
  const bool gdn = s.kind == Recurrence::gdn, kda = s.kind == Recurrence::kda;

  std::cout << fmt::format("== {} ({}): {}, {} SSM + {} attention layers, {} key / {} value heads, dk = {}, dv = {}\n",
                           s.name, s.short_name, recurrence_name(s.kind), s.ssm_layers, s.attention_layers, s.key_heads,
                           s.value_heads, s.dk, s.dv);
  std::cout << fmt::format("   state {}: M_S = {} B per head, {} per layer; record r = {} = {} B; M_S/r = {:.2f}\n\n",
                           sf_name, group(M), binary(static_cast<double>(M) * nv),
                           kda ? "2dv+6dk (dk fp32 decays)" : "2dv+2dk+4", r,
                           static_cast<double>(M) / static_cast<double>(r));

  // ---- traffic per window ----
  const Traffic conv = conventional_window_traffic(M, L);
  const Traffic rep = replay_window_traffic(M, r, L);
  const auto conv_t = static_cast<double>(conv.total()), rep_t = static_cast<double>(rep.total());
  const Traffic rep_layer_shared = replay_window_traffic(layer_state_bytes(s, sf), layer_record_bytes(s, false, true), L);
  std::cout << fmt::format("Memory traffic per window of L = {} steps, state {} (bytes)\n", L, sf_name);
  std::cout << fmt::format("  {:<44} {:>17} {:>17} {:>12}\n", "", "conventional", "replay", "replay/conv");
  auto row = [](const std::string& label, double c, double rp) {
    std::cout << fmt::format("  {:<44} {:>17} {:>17} {:>12.3f}\n", label, group(c), group(rp), rp / c);
  };
  row("per head", conv_t, rep_t);
  row("per head, per step (window average)", conv_t / L, rep_t / L);
  row(fmt::format("per layer ({} value heads)", s.value_heads), conv_t * nv, rep_t * nv);
  row("per layer, k stored once per key head (GQA)", conv_t * nv, static_cast<double>(rep_layer_shared.total()));
  row(fmt::format("per model ({} SSM layers), per step", s.ssm_layers), conv_t * nv * s.ssm_layers / L,
      rep_t * nv * s.ssm_layers / L);
  std::cout << fmt::format(
      "  replay per head = checkpoint {} reads + 1 write ({} B) + records {} reads + {} writes ({} B)\n"
      "                  = (L+1) M_S + (L-1)(L+2)/2 r; the current step's record stays on chip\n\n",
      L, group(static_cast<double>(rep.state())), group(static_cast<double>(rep.record_read / r)),
      group(static_cast<double>(rep.record_write / r)), group(static_cast<double>(rep.records())));

  // ---- FLOPs ----
  const WindowFlops f = window_flops(s.dv, s.dk, L);
  std::cout << fmt::format("FLOPs per head per step (average over the window) and arithmetic intensity\n");
  std::cout << fmt::format("  {:<56} {:>13} {:>13}\n", "", "FLOP/step", "FLOP/byte");
  auto frow = [&](const std::string& label, double flops, double bytes) {
    std::cout << fmt::format("  {:<56} {:>13} {:>13.3f}\n", label, group(flops / L), flops / bytes);
  };
  frow("conventional, 5 dv dk - dv", f.conventional, conv_t);
  frow("replay, state materialised every step, 2(h+3) dv dk", f.materialised, rep_t);
  frow("replay, output-only non-flush + materialised flush", f.output_only, rep_t);
  if (L >= 2)
    std::cout << fmt::format("  one step with h = 0 / h = L-2 = {} records buffered: output-only {} / {} FLOP, materialised {} / {}\n",
                             L - 2, group(output_only_step_flops(s.dv, s.dk, 0)),
                             group(output_only_step_flops(s.dv, s.dk, L - 2)), group(materialised_step_flops(s.dv, s.dk, 0)),
                             group(materialised_step_flops(s.dv, s.dk, L - 2)));
  if (gdn)
    std::cout << "  (the paper's Mamba-2 counts; a GDN step also needs S k for u = beta (v - alpha S k), about 2 dv dk more)\n";
  if (kda)
    std::cout << "  (the paper's Mamba-2 counts; a KDA step also needs S (alpha . k) for u = beta (v - S (alpha . k)), about\n"
                 "   2 dv dk more, and its channel-wise decay weights differ per value head)\n";
  std::cout << "\n";

  // ---- optimal window ----
  const double Md = static_cast<double>(M), rd = static_cast<double>(r);
  std::cout << "Optimal window L* = sqrt(2 a (M_S/r - T)), per-token traffic f(L) of paper C.5\n";
  const double Lstd = optimal_window(Md, rd, 1.0, 1.0);
  std::cout << fmt::format(
      "  standard decode (a = T = 1): L* = {:.1f} (with T = 0: {:.1f}); f(L) at L = {}: {} B/token, at L*: {} B/token\n",
      Lstd, optimal_window(Md, rd, 1.0, 0.0), L, group(per_token_traffic(L, Md, rd)),
      group(per_token_traffic(Lstd, Md, rd)));
  if (o.drafts > 0) {
    if (Md / rd > o.drafts) {
      const double Lspec = optimal_window(Md, rd, v.accepted, o.drafts);
      std::cout << fmt::format("  speculative (T = {}, a = {:g}): L* = {:.1f}; f(L) at L = {}: {} B/token, at L*: {} B/token\n",
                               o.drafts, v.accepted, Lspec, L, group(per_token_traffic(L, Md, rd, v.accepted, o.drafts)),
                               group(per_token_traffic(Lspec, Md, rd, v.accepted, o.drafts)));
    } else {
      std::cout << fmt::format("  speculative (T = {}, a = {:g}): no interior optimum (M_S/r <= T)\n", o.drafts, v.accepted);
    }
  }
  std::cout << "\n";

  // ---- crossover ----
  const auto ssm_conv_step = static_cast<double>(model_ssm_conventional_step_bytes(s, sf));
  const double ssm_replay_step = rep_t / L * nv * s.ssm_layers;
  std::cout << fmt::format("SSM vs attention traffic per decode step ({} SSM layers, state {})\n", s.ssm_layers, sf_name);
  std::cout << fmt::format("  SSM state traffic per step: conventional {} (read + write), replay (L = {}) {}\n",
                           binary(ssm_conv_step), L, binary(ssm_replay_step));
  const std::optional<double> kv = o.kv_bytes_per_token ? o.kv_bytes_per_token : s.kv_bytes_per_token;
  if (kv) {
    const std::string source = o.kv_bytes_per_token ? std::string("--kv-bytes-per-token") : std::string(s.kv_note);
    std::cout << fmt::format("  attention KV reads: {} layers x {} B per token ({}) = {} per token of context\n",
                             s.attention_layers, group(*kv), source, binary(s.attention_layers * *kv));
    std::cout << fmt::format("  crossover context: {} tokens (conventional), {} tokens (replay, L = {})\n\n",
                             group(crossover_context_tokens(ssm_conv_step, s.attention_layers, *kv)),
                             group(crossover_context_tokens(ssm_replay_step, s.attention_layers, *kv)), L);
  } else {
    std::cout << fmt::format("  crossover context: n/a, KV bytes per token {}\n", s.kv_note);
    std::cout << fmt::format("    (crossover = {} / ({} layers x KV bytes per token per layer))\n\n",
                             binary(ssm_conv_step), s.attention_layers);
  }

  // ---- low-precision read checkpoint ----
  const uint64_t r_split = record_bytes(s.kind, true, s.dv, s.dk);
  std::cout << fmt::format(
      "Low-precision read checkpoint, per head (Algorithm 3: non-flush steps read the LP copy, the flush reads\n"
      "the {} copy and writes both){}\n",
      sf_name, gdn   ? fmt::format("; GDN records hold (alpha, beta, u, v, k): r = 4dv+2dk+8 = {} B", r_split)
               : kda ? fmt::format("; KDA records hold (alpha (dk fp32), beta, u, v, k): r = 4dv+6dk+4 = {} B", r_split)
                     : "");
  std::cout << fmt::format("  {:<16} {:>11} {:>13} {:>15} {:>12} {:>17} {:>13}\n", "read format", "ckpt B", "window B",
                           "vs shared " + sf_name, "vs conv", "non-flush step B", "vs shared");
  const double shared_nonflush = L >= 2 ? replay_nonflush_step_bytes(M, r, L) : 0.0;
  auto lprow = [&](const std::string& label, uint64_t ckpt, double window_bytes, double nonflush) {
    std::cout << fmt::format("  {:<16} {:>11} {:>13} {:>15.3f} {:>12.3f} {:>17} {:>13}\n", label, group(static_cast<double>(ckpt)),
                             group(window_bytes), window_bytes / rep_t, window_bytes / conv_t,
                             L >= 2 ? group(nonflush) : std::string("-"),
                             L >= 2 ? fmt::format("{:.2f}x", shared_nonflush / nonflush) : std::string("-"));
  };
  lprow(fmt::format("{} (shared)", sf_name), M, rep_t, shared_nonflush);
  for (StorageFormat lp : {StorageFormat::fp16, StorageFormat::fp8b128, StorageFormat::nvfp4}) {
    const uint64_t Mlp = state_bytes(s.dv, s.dk, lp);
    const Traffic t = split_window_traffic(M, Mlp, r_split, L);
    lprow(std::string(formats::to_string(lp)), Mlp, static_cast<double>(t.total()),
          L >= 2 ? replay_nonflush_step_bytes(Mlp, r_split, L) : 0.0);
  }
  std::cout << "  (\"vs shared\" = bytes of a shared non-flush step / this one: the speed-up bound of a bandwidth-bound\n"
               "   non-flush kernel; the paper measures 1.61x / 2.82x / 3.83x for fp16 / fp8 / nvfp4 on Mamba-2)\n\n";

  // ---- policy modifiers: error feedback, decay-based read skipping (docs/ERROR_FEEDBACK_AND_SKIP.md) ----
  const double residual_bytes = 4.0 * s.dv * s.dk;
  std::cout << "Policy modifiers, per head (docs/ERROR_FEEDBACK_AND_SKIP.md)\n";
  std::cout << fmt::format(
      "  +ef (error feedback): every write of an ef copy also reads and writes its fp32 residual, +{} B per write\n"
      "    (per step conventional, per window of L = {} for a replay copy: {:.3f} of the {} replay window)\n",
      group(2 * residual_bytes), L, 2 * residual_bytes / rep_t, sf_name);
  std::cout << fmt::format(
      "  ,skip=auto (appendix F): a non-flush step whose gamma_h is below the read copy's unit roundoff reads no\n"
      "    checkpoint, saving the copy's bytes ({} {} B, fp16 {} B, fp8b128 {} B, nvfp4 {} B); a flush whose gamma_L\n"
      "    is below the recur copy's is a pure write, saving {} B. Which steps skip depends on the decays:\n"
      "    `replayssm info MODEL --decays --text-dir DIR` counts them per head class on real text.\n\n",
      sf_name, group(static_cast<double>(M)), group(static_cast<double>(state_bytes(s.dv, s.dk, StorageFormat::fp16))),
      group(static_cast<double>(state_bytes(s.dv, s.dk, StorageFormat::fp8b128))),
      group(static_cast<double>(state_bytes(s.dv, s.dk, StorageFormat::nvfp4))), group(static_cast<double>(M)));

  // ---- speculative verification ----
  if (o.drafts > 0) {
    const int T = o.drafts;
    const double a = v.accepted;
    std::cout << fmt::format("Speculative verification, T = {} drafts, mean accepted a = {:g}, L = {}, state {}\n", T, a, L,
                             sf_name);
    std::cout << fmt::format("  {:<40} {:>6} {:>7} {:>15} {:>17} {:>15}\n", "scheme", "reads", "writes", "B/step/head",
                             "B/step/layer", "B/token/head");
    auto srow = [&](const std::string& name, double reads, double writes, double bytes_head) {
      std::cout << fmt::format("  {:<40} {:>6.2f} {:>7.2f} {:>15} {:>17} {:>15}\n", name, reads, writes, group(bytes_head),
                               group(bytes_head * nv), group(bytes_head / a));
    };
    for (const SchemeTraffic& p : prior_speculative_schemes(T))
      srow(std::string(p.name), p.state_reads, p.state_writes, (p.state_reads + p.state_writes) * Md);
    const SpeculativeReplayTraffic rs = speculative_replay_traffic(L, T, a);
    srow("ReplaySSM (Algorithm 2), incl. records", rs.state_reads, rs.state_writes, rs.bytes_per_step(M, r));
    std::cout << fmt::format(
        "  reads/writes in full states; prior schemes exclude their cached-input traffic. ReplaySSM per verify step:\n"
        "  {:.2f} flushes, {:.2f} record reads (committed), {} record writes (drafts); {:.3f}x the vLLM snapshot bytes\n\n",
        rs.state_writes, rs.record_reads, T, rs.bytes_per_step(M, r) / ((1.0 + T) * Md));
  }
}

void run_traffic(const TrafficOptions& o) {
  const Validated v = validate(o);
  std::vector<const ModelShape*> shapes;
  if (o.shape == "all") {
    for (const ModelShape& s : ssm::paper_shapes()) shapes.push_back(&s);
  } else {
    shapes.push_back(&ssm::find_shape(o.shape));
  }
  for (const ModelShape* s : shapes) print_shape(*s, o, v);
}

}  // namespace

void register_traffic(CLI::App& app) {
  auto o = std::make_shared<TrafficOptions>();
  CLI::App* cmd = app.add_subcommand(
      "traffic", "Analytic models of the paper's appendix C: memory traffic, FLOPs, optimal window, SSM-vs-attention "
                 "crossover, low-precision reads and speculative verification for a model shape");
  std::string shape_help = "model shape: all";
  for (const ModelShape& s : ssm::paper_shapes()) shape_help += fmt::format(", {}", s.short_name);
  cmd->add_option("--shape", o->shape, shape_help)->required();
  cmd->add_option("--window", o->window, "window L: steps per flush, 1 to 2^20 (default 16)");
  cmd->add_option("--state-format", o->state_format,
                  "storage format of the (high-precision) state: fp32 (default), fp16, bf16, fp8b128, nvfp4, e4m3, e2m1");
  cmd->add_option("--drafts", o->drafts, "T: draft tokens per verify step (speculative decoding; default 0 = off)");
  cmd->add_option_function<double>(
      "--accepted", [o](double a) { o->accepted = a; },
      "A: mean accepted tokens per verify step, 1 <= A <= T (default T)");
  cmd->add_option_function<double>(
      "--kv-bytes-per-token", [o](double kv) { o->kv_bytes_per_token = kv; },
      "KV-cache bytes per token per attention layer (default: the paper's value where it gives one)");
  cmd->callback([o] { run_traffic(*o); });
}

}  // namespace replayssm::cli
