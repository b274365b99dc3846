// replayssm info MODEL_DIR: architecture, layer pattern, SSM head shapes and parameter count of a
// Hugging Face checkpoint. Validates config.json and every tensor's presence, dtype and shape
// without converting weight data (each tensor is only scanned in place for NaN and Inf, which
// are listed by tensor), so it stays cheap on large checkpoints. Quantized-weight checkpoints (FP8
// block-scaled, ModelOpt NVFP4) are checked the same way: the quantized matrices, their format,
// stored size and FP32 size are listed (model/quantized_weights.h). The forward's memory is
// estimated at a few lengths, or at --length N, for --threads worker threads.
//
// --decays --text-dir DIR (issue 11): runs the model (CPU, FP32 state) over the first --length
// positions of --books books and reports how long each SSM head remembers (model/decay_spectrum.h)
// and the bits per byte (per token for a --tokens-dir tokenization) of the texts; --json FILE writes
// the spectrum with its histograms.
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "io/text_source.h"
#include "model/causal_lm.h"
#include "model/decay_spectrum.h"

namespace replayssm::cli {
namespace {

struct InfoOptions {
  std::string dir, length;
  int threads = 0;
  bool decays = false;
  std::string text_dir, tokens_dir, json_out;
  int books = 4;
  std::vector<int> windows{16};
  bool force = false;
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

// --decays: the decay spectrum and bits per byte of the model on the books.
void report_decays(const InfoOptions& o, int64_t length) {
  if (o.text_dir.empty()) throw std::runtime_error("info --decays: give --text-dir DIR, a folder of .txt books");
  if (!o.json_out.empty() && !o.force && std::filesystem::exists(o.json_out))
    throw std::runtime_error(fmt::format("info --decays: --json {} exists (--force replaces it)", o.json_out));
  io::TextSourceOptions to;
  to.text_dir = o.text_dir;
  to.tokens_dir = o.tokens_dir;
  to.length = length;
  to.max_books = o.books;
  const io::LoadedBooks loaded = io::load_books(to);
  const model::CausalLM lm = model::CausalLM::load(o.dir);
  model::DecaySpectrumCollector collector(o.windows);
  const model::SequenceObserver observe = collector.observer();
  const bool bytes = loaded.tokenizer == "bytes";
  nlohmann::json books = nlohmann::json::array();
  double bits_total = 0.0;
  std::cout << fmt::format("decays of {} on {} positions of {} book{} from {} ({}), FP32 state (conv:fp32)\n", o.dir,
                           length, loaded.books.size(), loaded.books.size() == 1 ? "" : "s", o.text_dir,
                           loaded.tokenization);
  for (const io::Book& book : loaded.books) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int64_t> tokens(book.tokens.begin(), book.tokens.begin() + length);
    const model::Mat hidden = lm.final_hidden(tokens, model::PolicyAssignment(ssm::PrecisionPolicy::parse("conv:fp32")),
                                              o.threads, {}, &observe);
    // Bits of the true next tokens, LM head in chunks of rows.
    double nats = 0.0;
    model::Mat lp;
    constexpr int64_t kChunk = 256;
    for (int64_t r0 = 0; r0 < length; r0 += kChunk) {
      const int64_t rows = std::min(kChunk, length - r0);
      lm.lm_head(hidden.middleRows(r0, rows), true, o.threads, lp);
      for (int64_t i = 0; i < rows; ++i) nats -= lp(i, book.tokens[static_cast<std::size_t>(r0 + i + 1)]);
    }
    const double bits = nats / std::log(2.0) / static_cast<double>(length);
    bits_total += bits;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << fmt::format("  {:<12} {:.4f} bits per {} ({:.1f} s)\n", book.name, bits, bytes ? "byte" : "token",
                             seconds);
    books.push_back({{"name", book.name}, {bytes ? "bits_per_byte" : "bits_per_token", bits}});
  }
  const double mean_bits = bits_total / static_cast<double>(loaded.books.size());
  std::cout << fmt::format("  mean         {:.4f} bits per {}\n\n", mean_bits, bytes ? "byte" : "token");
  const std::vector<model::HeadDecaySpectrum> heads = collector.heads();
  const model::DecaySummary summary = model::summarize_decays(heads);
  std::cout << model::format_decay_report(heads, summary);
  if (!o.json_out.empty()) {
    nlohmann::json j = model::decay_report_json(heads, summary);
    j["model_dir"] = o.dir;
    j["text_dir"] = o.text_dir;
    j["tokenization"] = loaded.tokenization;
    j["positions_per_book"] = length;
    j["windows"] = o.windows;
    j["books"] = books;
    j[bytes ? "mean_bits_per_byte" : "mean_bits_per_token"] = mean_bits;
    io::write_file_atomically(o.json_out, j.dump(1) + "\n");
    std::cout << fmt::format("wrote {}\n", o.json_out);
  }
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
                  "estimate the forward's memory for N positions, 1 to 2^40 (default: N = 4096, 32768, 131072); with "
                  "--decays: positions per book (default 16384)");
  cmd->add_option("--threads", o->threads, "worker threads of the forward to estimate for (0: all hardware threads)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--decays", o->decays,
                "run the model over --text-dir and report each SSM head's decay spectrum (alpha, gamma over the "
                "--windows, effective memory 1/(1 - mean alpha)) and the bits per byte");
  cmd->add_option("--text-dir", o->text_dir, "--decays: folder of .txt books (Gutenberg headers stripped)");
  cmd->add_option("--tokens-dir", o->tokens_dir,
                  "--decays: token ids written by scripts/tokenize_text.py (default: byte-level ids)");
  cmd->add_option("--books", o->books, "--decays: books used, the first in name order (0: all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--windows", o->windows, "--decays: window lengths L of gamma (the product of alpha over L tokens)")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--json", o->json_out, "--decays: also write the spectrum (with histograms) to this JSON file");
  cmd->add_flag("--force", o->force, "--decays: replace --json when it exists");
  cmd->callback([o, length_option] {
    std::optional<int64_t> length;
    if (length_option->count()) length = parse_length(o->length);
    if (o->decays) {
      report_decays(*o, length.value_or(16384));
      return;
    }
    if (!o->text_dir.empty() || !o->tokens_dir.empty() || !o->json_out.empty())
      throw std::runtime_error("info: --text-dir, --tokens-dir and --json belong to --decays");
    const model::CausalLM lm = model::CausalLM::inspect(o->dir);
    std::cout << (length ? lm.describe({*length}, o->threads) : lm.describe({4096, 32768, 131072}, o->threads));
  });
}

}  // namespace replayssm::cli
