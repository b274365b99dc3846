// One file per subcommand; each registers its options on the shared CLI11 app.
#pragma once
#include <CLI/CLI.hpp>

namespace replayssm::cli {
void register_quantize(CLI::App& app);
void register_formats(CLI::App& app);
void register_info(CLI::App& app);
void register_logits(CLI::App& app);
void register_traffic(CLI::App& app);
void register_bench(CLI::App& app);
void register_kl_sweep(CLI::App& app);
}  // namespace replayssm::cli
