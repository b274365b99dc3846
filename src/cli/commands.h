// One file per subcommand; each registers its options on the shared CLI11 app.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

namespace replayssm::cli {
void register_quantize(CLI::App& app);
void register_formats(CLI::App& app);
void register_info(CLI::App& app);
void register_logits(CLI::App& app);
void register_traffic(CLI::App& app);
void register_bench(CLI::App& app);
void register_kl_sweep(CLI::App& app);
void register_state_error(CLI::App& app);

// Before anything is written: each output (option name, path) is a file name in an existing
// directory, distinct from the others and from every input, and absent unless `force`. Then the
// temporaries a killed earlier run left for these outputs are removed (the error otherwise names
// the option, the path and the expectation).
void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                   const std::vector<std::string>& inputs, bool force, std::string_view command);
}  // namespace replayssm::cli
