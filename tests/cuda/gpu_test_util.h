// What the GPU suites share: the skip on a machine without a CUDA device, and the English text the
// byte-level trained models read where a suite has no token file.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "test_util.h"

namespace replayssm::test {

// A suite defines one at namespace scope: constructed before any test runs, it makes the suite say
// why and exit 77 (ctest: SKIPPED) when no CUDA device is there. `what`: "attention kernel tests".
struct GpuGuard {
  explicit GpuGuard(const char* what) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      skip_suite(std::string("no CUDA device: ") + what + " run on the device machine (see docs/GPU_RESULTS.md)");
  }
};

// PG-19-like prose (token id = byte value) for the byte-level models.
inline constexpr const char* kEnglishText =
    "It was late in the autumn of the year when the travellers came at last within sight of the old town. The road "
    "had been long and the weather unkind; for three days the rain had followed them across the moor, and the horses "
    "were weary. \"We shall rest here,\" said the elder of the two, drawing his cloak about him, \"and to-morrow we "
    "shall see what the morning brings.\" His companion made no answer, but looked up at the grey walls. ";

}  // namespace replayssm::test
