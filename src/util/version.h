#pragma once
#include <string>

namespace replayssm {
// "0.1.0 (git 1a2b3c4d5e6f)" — the commit this binary was built from; stored in every result file.
std::string version_string();
std::string git_commit();
}  // namespace replayssm
