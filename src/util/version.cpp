#include "util/version.h"

#include "replayssm_version.h"

namespace replayssm {
std::string git_commit() { return REPLAYSSM_GIT_COMMIT; }
std::string version_string() { return std::string(REPLAYSSM_VERSION) + " (git " + REPLAYSSM_GIT_COMMIT + ")"; }
}  // namespace replayssm
