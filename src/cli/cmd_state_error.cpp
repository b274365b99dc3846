// replayssm state-error MODEL_DIR --text-dir DIR --json OUT (issue 11, paper appendix C.6 on real
// states): the FP32 forward over the books, every SSM head group's recurrence inputs replayed through
// the emulator under each policy (ssm/state_error.h: the stored checkpoint's error against the FP32
// state at every flush, and the section 6 error model's prediction); per head into the JSON file,
// a summary per policy on stdout. Plot: scripts/plot_state_error.py OUT.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "eval/policy_set.h"
#include "io/atomic_file.h"
#include "io/text_source.h"
#include "model/causal_lm.h"
#include "ssm/state_error.h"

namespace replayssm::cli {
namespace {

struct StateErrorOptions {
  std::string dir, text_dir, tokens_dir, json_out;
  std::string policies = "shared:nvfp4+sr@16,shared:nvfp4+rtn@16,shared:fp8b128+sr@16,split:nvfp4+rtn/fp32@16,"
                         "split:nvfp4+rtn/fp16+sr@16";
  int64_t length = 16384;
  int books = 1, threads = 0;
  bool force = false;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

nlohmann::json finite_or_null(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

void run_state_error(const StateErrorOptions& o) {
  if (!o.force && std::filesystem::exists(o.json_out))
    throw std::runtime_error(fmt::format("state-error: --json {} exists (--force replaces it)", o.json_out));
  const std::vector<ssm::PrecisionPolicy> policies =
      eval::expand_policies(eval::parse_policy_list(o.policies), {}, {});
  for (const auto& p : policies) ssm::check_state_error_policy(p);  // before any book or model is read
  io::TextSourceOptions to;
  to.text_dir = o.text_dir;
  to.tokens_dir = o.tokens_dir;
  to.length = o.length;
  to.max_books = o.books;
  const io::LoadedBooks loaded = io::load_books(to);
  const model::CausalLM lm = model::CausalLM::load(o.dir);
  std::cout << fmt::format("state-error: {} on {} positions of {} book{} ({}); {} policies\n", o.dir, o.length,
                           loaded.books.size(), loaded.books.size() == 1 ? "" : "s", loaded.tokenization,
                           policies.size());
  // Per policy: one JSON entry per (book, layer, value head).
  std::vector<nlohmann::json> rows(policies.size(), nlohmann::json::array());
  std::mutex mutex;
  std::string current_book;
  const model::SequenceObserver observe = [&](const ssm::HeadGroupSequence& seq, ssm::HeadGroupId id) {
    for (std::size_t p = 0; p < policies.size(); ++p) {
      const std::vector<ssm::HeadStateError> heads = ssm::measure_state_error(seq, policies[p], id);
      const std::lock_guard<std::mutex> lock(mutex);
      for (const auto& h : heads)
        rows[p].push_back({{"book", current_book},
                           {"layer", id.layer},
                           {"value_head", h.value_head},
                           {"recurrence", std::string(ssm::to_string(seq.kind))},
                           {"events", h.events},
                           {"steady_events", h.steady_events},
                           {"state_ms", h.state_ms},
                           {"measured_ms", h.measured_ms},
                           {"measured_bias", h.measured_bias},
                           {"recur_measured_ms", h.recur_measured_ms},
                           {"rounding_bias", h.rounding_bias},
                           {"rounding_var", h.rounding_var},
                           {"recur_rounding_bias", h.recur_rounding_bias},
                           {"recur_rounding_var", h.recur_rounding_var},
                           {"mean_gamma", h.mean_gamma},
                           {"mean_gamma2", h.mean_gamma2},
                           {"predicted_ms", std::isfinite(h.predicted_ms) ? nlohmann::json(h.predicted_ms) : nullptr},
                           {"coherent_ms", std::isfinite(h.coherent_ms) ? nlohmann::json(h.coherent_ms) : nullptr},
                           {"channel_mean_predicted_ms", finite_or_null(h.channel_mean_predicted_ms)},
                           {"realized_bias", finite_or_null(h.realized_bias)},
                           {"realized_var", finite_or_null(h.realized_var)},
                           {"realized_cross", finite_or_null(h.realized_cross)},
                           {"realized_predicted_ms", finite_or_null(h.realized_predicted_ms)}});
    }
  };
  for (const io::Book& book : loaded.books) {
    current_book = book.name;
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int64_t> tokens(book.tokens.begin(), book.tokens.begin() + o.length);
    lm.final_hidden(tokens, model::PolicyAssignment(ssm::PrecisionPolicy::parse("conv:fp32")), o.threads, {},
                    &observe);
    std::cout << fmt::format("  {}: {:.1f} s\n", book.name,
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  nlohmann::json out{{"model_dir", o.dir},
                     {"text_dir", o.text_dir},
                     {"tokenization", loaded.tokenization},
                     {"positions_per_book", o.length},
                     {"model",
                      "per head: D = stored read copy - FP32 state at the flushes of the second half; predicted = "
                      "shared sigma^2/(1-E[gamma^2]) + (b/(1-E[gamma]))^2, split sigma_read^2 + b_read^2 (+ the recur "
                      "copy's shared term); coherent = (sigma^2 + b^2)/(1-E[gamma])^2; realized_* (Mamba-2) = the same shared model "
                      "with the moments of the rounding errors the recur copy actually received, r_e = D_e - gamma_e "
                      "D_{e-1} (ssm/state_error.h)"},
                     {"policies", nlohmann::json::array()}};
  std::cout << fmt::format("{:<30} {:>6} {:>16} {:>16} {:>22} {:>16} {:>14}\n", "policy", "heads", "median measured",
                           "median measured", "heads within 2x of", "median measured", "median");
  std::cout << fmt::format("{:<30} {:>6} {:>16} {:>16} {:>22} {:>16} {:>14}\n", "", "", "/ predicted", "/ coherent",
                           "the prediction", "/ realized", "rel. MS");
  for (auto& policy_rows : rows) {  // head groups finish in thread order: write them in (book, layer, head) order
    auto& heads = policy_rows.get_ref<nlohmann::json::array_t&>();
    std::sort(heads.begin(), heads.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
      return std::make_tuple(a["book"].get<std::string>(), a["layer"].get<int>(), a["value_head"].get<int>()) <
             std::make_tuple(b["book"].get<std::string>(), b["layer"].get<int>(), b["value_head"].get<int>());
    });
  }
  for (std::size_t p = 0; p < policies.size(); ++p) {
    std::vector<double> ratio, coh, rel, real;
    int within = 0;
    for (const auto& r : rows[p]) {
      const double m = r["measured_ms"].get<double>();
      if (!r["realized_predicted_ms"].is_null() && r["realized_predicted_ms"].get<double>() > 0)
        real.push_back(m / r["realized_predicted_ms"].get<double>());
      if (!r["predicted_ms"].is_null() && r["predicted_ms"].get<double>() > 0) {
        const double q = m / r["predicted_ms"].get<double>();
        ratio.push_back(q);
        within += q >= 0.5 && q <= 2.0;
      }
      if (!r["coherent_ms"].is_null() && r["coherent_ms"].get<double>() > 0)
        coh.push_back(m / r["coherent_ms"].get<double>());
      if (r["state_ms"].get<double>() > 0) rel.push_back(m / r["state_ms"].get<double>());
    }
    std::cout << fmt::format("{:<30} {:>6} {:>16.3f} {:>16.3f} {:>22} {:>16} {:>14.3e}\n", policies[p].to_string(),
                             rows[p].size(), median(ratio), median(coh), fmt::format("{} of {}", within, ratio.size()),
                             real.empty() ? std::string("-") : fmt::format("{:.3f}", median(real)), median(rel));
    out["policies"].push_back({{"policy", policies[p].to_string()}, {"heads", rows[p]}});
  }
  io::write_file_atomically(o.json_out, out.dump(1) + "\n");
  std::cout << fmt::format("wrote {} (plot: python3 scripts/plot_state_error.py {})\n", o.json_out, o.json_out);
}

}  // namespace

void register_state_error(CLI::App& app) {
  auto o = std::make_shared<StateErrorOptions>();
  CLI::App* cmd = app.add_subcommand(
      "state-error",
      "The stored state's error on real inputs against the error model of appendix C.6 (REPLAYSSM.md\n"
      "section 6): the FP32 forward over the books; every SSM head's inputs replayed under each policy;\n"
      "at each flush the error of the copy that is read, against sigma^2/(1-E[gamma^2]) + (b/(1-E[gamma]))^2\n"
      "(shared) or one rounding (split). Writes --json; scripts/plot_state_error.py plots it.");
  cmd->add_option("MODEL_DIR", o->dir, "model directory")->required();
  cmd->add_option("--text-dir", o->text_dir, "folder of .txt books (Gutenberg headers stripped)")->required();
  cmd->add_option("--tokens-dir", o->tokens_dir, "token ids written by scripts/tokenize_text.py (default: bytes)");
  cmd->add_option("--json", o->json_out, "output JSON file (written atomically)")->required();
  cmd->add_option("--policies", o->policies, "shared or split policies, comma-separated (without @L: L = 16)")
      ->capture_default_str();
  cmd->add_option("--length", o->length, "positions per book")->capture_default_str()->check(CLI::Range(int64_t{32}, io::kMaxLength));
  cmd->add_option("--books", o->books, "books, the first in name order (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", o->threads, "worker threads (0: all hardware threads)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--force", o->force, "replace --json when it exists");
  cmd->callback([o] { run_state_error(*o); });
}

}  // namespace replayssm::cli
