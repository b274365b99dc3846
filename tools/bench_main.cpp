// replayssm-bench: `replayssm bench` alone. The same command code (src/cli/cmd_bench.cpp) without
// the toolkit's model, sweep and HDF5 code, so the binary needs only the C++ runtime and fmt and
// can be carried to a GPU machine that lacks the toolkit's libraries.
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "util/version.h"

int main(int argc, char** argv) {
  CLI::App app{"replayssm-bench — the decode-kernel benchmark of replayssm (same as `replayssm bench`)"};
  app.set_version_flag("--version", replayssm::version_string(), "Print the toolkit version and git commit");
  app.require_subcommand(1);
  replayssm::io::install_temp_cleanup_handlers();  // an interrupted --csv write leaves no temporary
  replayssm::cli::register_bench(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // As `replayssm` (src/cli/main.cpp): --help and --version exit 0, every refused command line 2.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::cerr << "replayssm-bench: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
