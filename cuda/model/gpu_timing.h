// GPU time of intervals of stream work, summed per category, for the per-pass time split of the
// GPU sweep (issue 10 benchmark: "the time split (GEMMs, attention, scans, KL)"). Each interval is a
// pair of CUDA events recorded on the stream; events are pooled and reused, and read back once per
// pass (collect), so timing adds two event records per interval and no synchronisation before collect.
// Intervals may nest or overlap (a layer and the GEMMs inside it); each is summed into its own category.
#pragma once
#include <cuda_runtime.h>

#include <vector>

namespace replayssm::cuda {

class GpuIntervals {
 public:
  explicit GpuIntervals(int categories);
  ~GpuIntervals();
  GpuIntervals(const GpuIntervals&) = delete;
  GpuIntervals& operator=(const GpuIntervals&) = delete;

  // Records the start of an interval of `category` on `stream`; returns its id for end().
  int begin(int category, cudaStream_t stream);
  void end(int id, cudaStream_t stream);
  // Waits for every recorded event, returns the seconds per category (categories() entries) and
  // forgets the intervals (their events are reused). Throws std::logic_error for an interval begun
  // and not ended.
  std::vector<double> collect();
  // Forgets every interval without reading it (after an exception left some open).
  void clear();
  int categories() const { return categories_; }

 private:
  struct Interval {
    int start = -1, stop = -1, category = 0;
  };
  int event(cudaStream_t stream);  // index of a pooled event, recorded on stream
  int categories_;
  std::vector<cudaEvent_t> events_;
  int used_ = 0;
  std::vector<Interval> intervals_;
};

}  // namespace replayssm::cuda
