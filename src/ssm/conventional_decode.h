// Conventional decode (REPLAYSSM.md section 1): every step reads the stored state, updates it,
// computes the output from the updated float32 state and writes the state back in its storage
// format (quantized after every step, SR stream event = step index; see state_quantizer.h).
#pragma once
#include <vector>

#include "ssm/decoder.h"

namespace replayssm::ssm {

class ConventionalDecoder final : public HeadGroupDecoder {
 public:
  // policy.scheme must be conventional; throws std::invalid_argument otherwise or on a shape the
  // storage format cannot hold.
  ConventionalDecoder(const HeadGroupShape& shape, const PrecisionPolicy& policy, HeadGroupId id = {});

  void step(const GroupToken& x, float* out) override;
  const HeadGroupShape& shape() const override { return shape_; }
  int64_t tokens() const override { return steps_; }
  int64_t quantization_events() const override { return steps_; }

  // The stored state of value head g (dequantized: what the next step reads).
  const StateMatrix& state(int g) const { return state_.at(static_cast<std::size_t>(g)); }

 private:
  HeadGroupShape shape_;
  PrecisionPolicy policy_;
  HeadGroupId id_;
  int64_t steps_ = 0;
  std::vector<StateMatrix> state_;
  std::vector<StateMatrix> residual_;  // error feedback (+ef): what the last write of each state dropped
  Vector a_, v_, k_, q_, u_, o_;
  StepScratch scratch_;
};

}  // namespace replayssm::ssm
