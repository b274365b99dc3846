#include "cuda_check.h"

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace replayssm::cuda {

void throw_cuda_error(const char* file, int line, const char* call, cudaError_t error) {
  throw std::runtime_error(fmt::format("{}:{}: {} failed: {}", file, line, call, cudaGetErrorString(error)));
}

void throw_invalid_argument(const char* what, const char* name1, long value1, const char* name2, long value2) {
  std::string message = what;
  if (name1) message += fmt::format(" (got {} = {}", name1, value1) + (name2 ? fmt::format(", {} = {})", name2, value2) : ")");
  throw std::invalid_argument(message);
}

}  // namespace replayssm::cuda
