// The checks every subcommand that writes files runs before writing any: results are never
// silently overwritten (--force replaces them), and a bad output path fails before any work.
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include <fmt/format.h>

#include "cli/commands.h"
#include "io/atomic_file.h"

namespace replayssm::cli {
namespace fs = std::filesystem;

void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                   const std::vector<std::string>& inputs, bool force, std::string_view command) {
  std::error_code ec;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& [option, path] = outputs[i];
    const fs::path p(path);
    if (p.filename().empty() || p.filename() == "." || p.filename() == "..")
      throw std::invalid_argument(fmt::format("{} '{}': expected a file name to write", option, path));
    const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    if (!fs::is_directory(dir, ec))
      throw std::invalid_argument(
          fmt::format("{} '{}': the directory {} does not exist (create it first)", option, path, dir.string()));
    if (fs::is_directory(p, ec))
      throw std::invalid_argument(fmt::format("{} '{}': is a directory, expected a file name to write", option, path));
    for (const std::string& in : inputs)
      if (fs::equivalent(p, in, ec))
        throw std::invalid_argument(
            fmt::format("{} '{}': is the input {}; write the result to another file", option, path, in));
    for (std::size_t j = 0; j < i; ++j)
      if (fs::weakly_canonical(p, ec) == fs::weakly_canonical(outputs[j].second, ec))
        throw std::invalid_argument(
            fmt::format("{} '{}': the same file as {}; every output needs its own file", option, path, outputs[j].first));
    if (!force && fs::exists(fs::symlink_status(p, ec)))
      throw std::invalid_argument(
          fmt::format("{} '{}': exists; refusing to overwrite a result (use --force to replace it)", option, path));
  }
  for (const auto& [option, path] : outputs) {
    const fs::path p(path);
    io::remove_stale_temps(p.parent_path().empty() ? "." : p.parent_path().string(), p.filename().string(), std::cerr,
                           command);
  }
}

}  // namespace replayssm::cli
