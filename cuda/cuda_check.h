// Every CUDA call is checked where it is made: file, line, call and CUDA's message.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define REPLAYSSM_CUDA_CHECK(call)                                                                            \
  do {                                                                                                        \
    const cudaError_t replayssm_err_ = (call);                                                                \
    if (replayssm_err_ != cudaSuccess)                                                                        \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #call " failed: " + \
                               cudaGetErrorString(replayssm_err_));                                           \
  } while (0)

// After a kernel launch: launch-configuration errors now, execution errors at the next sync.
#define REPLAYSSM_CUDA_CHECK_LAUNCH() REPLAYSSM_CUDA_CHECK(cudaGetLastError())
