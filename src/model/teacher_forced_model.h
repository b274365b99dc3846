// The teacher-forced model contract: what the KL sweep (src/eval) needs from a language model.
//
// Teacher forcing runs the whole sequence layer by layer, so the natural split is: one pass that
// produces the final (normed) hidden states of every position — O(N·d) memory — and an LM head
// applied to any slice of positions. The sweep keeps the FP32 reference's hidden states for a book
// and streams both distributions chunk by chunk: logits of 128K positions are never all held.
// Implemented by CausalLM (teacher_forced_model.cpp); the eval tests implement it with a tiny model.
#pragma once
#include <Eigen/Dense>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "ssm/precision_policy.h"

namespace replayssm::model {

class CausalLM;
using RowMatrixXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

class TeacherForcedModel {
 public:
  virtual ~TeacherForcedModel() = default;
  virtual int vocab_size() const = 0;
  virtual int hidden_size() const = 0;
  // Short description for logs and result attributes (architecture, sizes).
  virtual std::string description() const = 0;
  // A stable content hash of the weights and config (stored with results).
  virtual std::string content_hash() const = 0;
  // Final-norm hidden states for every position (tokens.size() x hidden_size), every SSM layer's
  // recurrence run under `policy`. May contain non-finite values when a state overflows.
  virtual RowMatrixXf final_hidden(std::span<const int32_t> tokens, const ssm::PrecisionPolicy& policy) = 0;
  // Log-probabilities (rows x vocab_size) of the next token for the given hidden-state rows.
  virtual RowMatrixXf log_probs(const Eigen::Ref<const RowMatrixXf>& hidden_rows) = 0;
  // The loaded checkpoint behind the contract, when it is one (the GPU engine uploads its weights).
  virtual const CausalLM* causal_lm() const { return nullptr; }
};

// Loads the checkpoint in `dir` (config.json + safetensors) as a TeacherForcedModel: final_hidden
// runs every SSM layer under the given policy on `threads` worker threads (0: all hardware threads;
// the results do not depend on the count, tensor_ops.h); log_probs is the LM head +
// log-softmax of any hidden rows; content_hash is 16 hex digits over config.json and the weight
// files (computed on first use); description: model_type, pattern, SSM head shapes, parameters.
// Throws std::runtime_error naming the directory and what is missing or unsupported.
std::unique_ptr<TeacherForcedModel> load_teacher_forced_model(const std::string& dir, int threads = 0);

}  // namespace replayssm::model
