// Adapter from CausalLM to the KL sweep's contract (src/eval/teacher_forced_model.h).
// eval::load_teacher_forced_model (src/eval/model_factory.h) is defined in causal_lm.cpp, an
// object file every user of the model library pulls in, so that a weak reference to it resolves.
#pragma once
#include <memory>

#include "eval/teacher_forced_model.h"
#include "model/causal_lm.h"

namespace replayssm::model {

// final_hidden: every SSM layer under the given policy, all hardware threads; log_probs: LM head
// + log-softmax of any hidden rows; content_hash: 16 hex digits over config.json and the weight
// files (computed on first use); description: model_type, pattern, SSM head shapes, parameters.
std::unique_ptr<eval::TeacherForcedModel> as_teacher_forced_model(CausalLM lm);

}  // namespace replayssm::model
