// What the literal decoders (conventional_decode.h, replay_decode.h) share: one token's inputs for
// a head group, and the step interface every decoding scheme implements.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ssm/recurrence.h"

namespace replayssm::ssm {

// One token's inputs for a head group (section 1 conventions). q and k (dk floats) belong to the
// key head; per value head g: alpha[g] (1 float, or dk for kda), beta[g] (gdn/kda; ignored for
// mamba2) and v[g] (dv floats). Caller-owned memory, read during the call only.
struct GroupToken {
  const float* q = nullptr;
  const float* k = nullptr;
  std::vector<const float*> alpha;
  std::vector<float> beta;
  std::vector<const float*> v;
};

// Token t of a sequence (the emulator's input form).
GroupToken token_of(const HeadGroupSequence& seq, int t);

// Throws std::invalid_argument when x does not fit the shape.
void check_token(const HeadGroupShape& shape, const GroupToken& x);

class HeadGroupDecoder {
 public:
  virtual ~HeadGroupDecoder() = default;
  // Decodes one token (standard decode): out receives n_value_heads x dv outputs, value head major.
  virtual void step(const GroupToken& x, float* out) = 0;
  virtual const HeadGroupShape& shape() const = 0;
  // Tokens decoded (committed) so far.
  virtual int64_t tokens() const = 0;
  // Quantization events so far (conventional: steps; ReplaySSM: checkpoint writes).
  virtual int64_t quantization_events() const = 0;
};

}  // namespace replayssm::ssm
