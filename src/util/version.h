#pragma once
#include <string>

namespace replayssm {
// "0.1.0 (git 1a2b3c4d5e6f)" — the commit this binary was built from; stored in every result file.
std::string version_string();
std::string git_commit();
// The host instruction set the CPU code was built for ("native", "portable" or a -march value,
// CMake's REPLAYSSM_HOST_ISA); "native" is followed by the machine's -march=native name when the
// compiler defines one. Stored in every result file: the reference's last bits depend on it.
std::string build_host_isa();
}  // namespace replayssm
