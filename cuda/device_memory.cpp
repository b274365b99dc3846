#include "device_memory.h"

namespace replayssm::cuda {

std::vector<float> to_host(ConstDeviceMatrix m) {
  std::vector<float> out(static_cast<std::size_t>(m.rows * m.cols));
  if (!out.empty())
    REPLAYSSM_CUDA_CHECK(cudaMemcpy2D(out.data(), static_cast<std::size_t>(m.cols) * sizeof(float), m.data,
                                      static_cast<std::size_t>(m.ld) * sizeof(float),
                                      static_cast<std::size_t>(m.cols) * sizeof(float),
                                      static_cast<std::size_t>(m.rows), cudaMemcpyDeviceToHost));
  return out;
}

void upload(const float* host, DeviceMatrix m, cudaStream_t stream) {
  if (m.rows * m.cols == 0) return;
  REPLAYSSM_CUDA_CHECK(cudaMemcpy2DAsync(m.data, static_cast<std::size_t>(m.ld) * sizeof(float), host,
                                         static_cast<std::size_t>(m.cols) * sizeof(float),
                                         static_cast<std::size_t>(m.cols) * sizeof(float),
                                         static_cast<std::size_t>(m.rows), cudaMemcpyHostToDevice, stream));
}

}  // namespace replayssm::cuda
