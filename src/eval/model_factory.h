// How the command line gets a model: implemented in src/model when the Hugging Face models land
// (declared here so that src/eval and src/cli can be written and tested against the contract).
#pragma once
#include <memory>
#include <string>

#include "eval/teacher_forced_model.h"

namespace replayssm::eval {

// Loads the checkpoint in `dir` (config.json + safetensors) as a TeacherForcedModel. Throws
// std::runtime_error naming the directory and what is missing or unsupported.
std::unique_ptr<TeacherForcedModel> load_teacher_forced_model(const std::string& dir);

}  // namespace replayssm::eval
