// cuBLAS, loaded when the first GPU model needs it (dlopen) instead of linked: a linked
// libcublasLt costs every run of the `replayssm` executable ~210 MB of resident memory for its
// relocations (measured: `replayssm --version` 11 MB without, 223 MB with), on machines with or
// without a GPU. Only the entry points the toolkit calls are resolved; a missing library or symbol
// is refused naming it.
#pragma once
#include <cublas_v2.h>

namespace replayssm::cuda {

struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t);
  cublasStatus_t (*get_math_mode)(cublasHandle_t, cublasMath_t*);
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float*,
                          const float*, int, const float*, int, const float*, float*, int);
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  const char* (*status_name)(cublasStatus_t);
  const char* (*status_string)(cublasStatus_t);
};

// The loaded API (loaded on first call, thread-safe). Throws std::runtime_error when
// libcublas.so.<major of the headers> or one of its entry points cannot be found.
const CublasApi& cublas_api();

}  // namespace replayssm::cuda
