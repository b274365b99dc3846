// Every CUDA call is checked where it is made: file, line, call and CUDA's message.
#pragma once
#include <cuda_runtime.h>

namespace replayssm::cuda {
// Message building lives in cuda_check.cpp (host C++): .cu files then reference no std::string
// internals, which the linker would otherwise resolve from an arbitrary object of the core library.
[[noreturn]] void throw_cuda_error(const char* file, int line, const char* call, cudaError_t error);
// std::invalid_argument with "<what> (got <name> = <value>, ...)"; up to two named values.
[[noreturn]] void throw_invalid_argument(const char* what, const char* name1 = nullptr, long value1 = 0,
                                         const char* name2 = nullptr, long value2 = 0);
}  // namespace replayssm::cuda

#define REPLAYSSM_CUDA_CHECK(call)                                                                 \
  do {                                                                                             \
    const cudaError_t replayssm_err_ = (call);                                                     \
    if (replayssm_err_ != cudaSuccess) ::replayssm::cuda::throw_cuda_error(__FILE__, __LINE__, #call, replayssm_err_); \
  } while (0)

// After a kernel launch: launch-configuration errors now, execution errors at the next sync.
#define REPLAYSSM_CUDA_CHECK_LAUNCH() REPLAYSSM_CUDA_CHECK(cudaGetLastError())
