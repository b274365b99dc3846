#include "util/version.h"

#include "replayssm_version.h"

#ifndef REPLAYSSM_HOST_ISA
#error "REPLAYSSM_HOST_ISA is defined by CMakeLists.txt (replayssm_add_core)"
#endif

namespace replayssm {
std::string git_commit() { return REPLAYSSM_GIT_COMMIT; }
std::string version_string() { return std::string(REPLAYSSM_VERSION) + " (git " + REPLAYSSM_GIT_COMMIT + ")"; }
std::string build_host_isa() {
  // The widest vector extension the compiler was allowed to use, so "native" says what it meant.
  std::string ext;
#if defined(__AVX512F__)
  ext = "avx512f";
#elif defined(__AVX2__)
  ext = "avx2";
#elif defined(__AVX__)
  ext = "avx";
#elif defined(__SSE4_2__)
  ext = "sse4.2";
#elif defined(__SSE2__)
  ext = "sse2";
#endif
#if defined(__FMA__)
  ext += "+fma";
#endif
  const std::string isa = REPLAYSSM_HOST_ISA;
  return ext.empty() ? isa : isa + " (" + ext + ")";
}
}  // namespace replayssm
