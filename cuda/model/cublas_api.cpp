#include "model/cublas_api.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace replayssm::cuda {
namespace {

template <class F>
void resolve(void* lib, const char* lib_name, const char* symbol, F& out) {
  dlerror();
  void* p = dlsym(lib, symbol);
  if (p == nullptr)
    throw std::runtime_error(fmt::format("{}: no symbol {} ({})", lib_name, symbol, dlerror()));
  out = reinterpret_cast<F>(p);
}

CublasApi load() {
  // The major version the headers (and so the calls' signatures) belong to.
  const std::string name = fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr)
    throw std::runtime_error(fmt::format("cannot load cuBLAS ({}): {}; put the CUDA toolkit's lib64 on "
                                         "LD_LIBRARY_PATH, or use --device cpu",
                                         name, dlerror()));
  CublasApi api{};
  resolve(lib, name.c_str(), "cublasCreate_v2", api.create);
  resolve(lib, name.c_str(), "cublasDestroy_v2", api.destroy);
  resolve(lib, name.c_str(), "cublasSetStream_v2", api.set_stream);
  resolve(lib, name.c_str(), "cublasSetMathMode", api.set_math_mode);
  resolve(lib, name.c_str(), "cublasGetMathMode", api.get_math_mode);
  resolve(lib, name.c_str(), "cublasSgemm_v2", api.sgemm);
  resolve(lib, name.c_str(), "cublasGemmEx", api.gemm_ex);
  resolve(lib, name.c_str(), "cublasGetStatusName", api.status_name);
  resolve(lib, name.c_str(), "cublasGetStatusString", api.status_string);
  return api;  // the library stays loaded for the process's lifetime
}

}  // namespace

const CublasApi& cublas_api() {
  static const CublasApi api = load();
  return api;
}

}  // namespace replayssm::cuda
