// replayssm: numerical-analysis toolkit for low-precision SSM state under ReplaySSM decoding.
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "io/atomic_file.h"
#include "util/version.h"

int main(int argc, char** argv) {
  // Before any output is opened: an interrupt or a file-size limit must not leave a temporary behind.
  replayssm::io::install_temp_cleanup_handlers();
  CLI::App app{
      "replayssm — study SSM layers (Mamba-2, Gated DeltaNet, KDA) whose recurrent state is stored in low\n"
      "precision and decoded the ReplaySSM way (checkpoint + buffer of recent inputs, flushed every L steps).\n"
      "Number formats are bit-exact to CUDA's conversions and to Transformer Engine's NVFP4 recipe."};
  app.set_version_flag("--version", replayssm::version_string() + "\nhost ISA " + replayssm::build_host_isa(),
                       "Print the toolkit version, git commit and host instruction set");
  app.require_subcommand(1);
  replayssm::cli::register_quantize(app);
  replayssm::cli::register_formats(app);
  replayssm::cli::register_info(app);
  replayssm::cli::register_logits(app);
  replayssm::cli::register_traffic(app);
  replayssm::cli::register_bench(app);
  replayssm::cli::register_kl_sweep(app);
  replayssm::cli::register_state_error(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every refused command line exits 2, like every other bad input.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    std::cerr << "replayssm: error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
