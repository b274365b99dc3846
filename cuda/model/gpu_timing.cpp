// GpuIntervals (gpu_timing.h).
#include "model/gpu_timing.h"

#include <stdexcept>

#include <fmt/format.h>

#include "cuda_check.h"

namespace replayssm::cuda {

GpuIntervals::GpuIntervals(int categories) : categories_(categories) {
  if (categories < 1) throw std::invalid_argument(fmt::format("GpuIntervals: {} categories (expected >= 1)", categories));
}

GpuIntervals::~GpuIntervals() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);  // no check: a destructor must not throw
}

int GpuIntervals::event(cudaStream_t stream) {
  if (used_ == static_cast<int>(events_.size())) {
    cudaEvent_t e = nullptr;
    REPLAYSSM_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  REPLAYSSM_CUDA_CHECK(cudaEventRecord(events_[static_cast<std::size_t>(used_)], stream));
  return used_++;
}

int GpuIntervals::begin(int category, cudaStream_t stream) {
  if (category < 0 || category >= categories_)
    throw std::invalid_argument(fmt::format("GpuIntervals::begin: category {} outside [0, {})", category, categories_));
  Interval iv;
  iv.category = category;
  iv.start = event(stream);
  intervals_.push_back(iv);
  return static_cast<int>(intervals_.size()) - 1;
}

void GpuIntervals::end(int id, cudaStream_t stream) {
  if (id < 0 || id >= static_cast<int>(intervals_.size()) || intervals_[static_cast<std::size_t>(id)].stop >= 0)
    throw std::logic_error(fmt::format("GpuIntervals::end: interval {} was not begun or is already ended", id));
  intervals_[static_cast<std::size_t>(id)].stop = event(stream);
}

std::vector<double> GpuIntervals::collect() {
  std::vector<double> seconds(static_cast<std::size_t>(categories_), 0.0);
  for (const Interval& iv : intervals_) {
    if (iv.stop < 0) throw std::logic_error("GpuIntervals::collect: an interval was begun and not ended");
    REPLAYSSM_CUDA_CHECK(cudaEventSynchronize(events_[static_cast<std::size_t>(iv.stop)]));
    float ms = 0.0f;
    REPLAYSSM_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[static_cast<std::size_t>(iv.start)],
                                              events_[static_cast<std::size_t>(iv.stop)]));
    seconds[static_cast<std::size_t>(iv.category)] += 1e-3 * ms;
  }
  clear();
  return seconds;
}

void GpuIntervals::clear() {
  intervals_.clear();
  used_ = 0;
}

}  // namespace replayssm::cuda
