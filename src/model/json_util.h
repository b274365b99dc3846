// JSON helpers for Hugging Face config files: reading with Python's non-standard number
// literals (Infinity, -Infinity, NaN, and transformers' {"__float__": "Infinity"}) and typed
// access whose errors name the file and the key.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace replayssm::model {

// Parses a JSON file; bare Infinity/-Infinity/NaN outside strings become the strings
// "Infinity"/"-Infinity"/"NaN" (read back by as_double). Throws std::runtime_error naming the file.
nlohmann::json read_json_file(const std::string& path);

// A JSON object plus the name of where it came from ("DIR/config.json", or "...config.json: text_config").
class JsonObject {
 public:
  JsonObject(nlohmann::json j, std::string where);
  const nlohmann::json& json() const { return j_; }
  const std::string& where() const { return where_; }
  bool has(const std::string& key) const;  // present and not null

  // Required keys: a missing key or a value of the wrong type throws, naming file and key.
  int64_t get_int(const std::string& key) const;
  double get_double(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  // Optional keys: the default when absent or null.
  int64_t get_int(const std::string& key, int64_t dflt) const;
  double get_double(const std::string& key, double dflt) const;
  bool get_bool(const std::string& key, bool dflt) const;
  std::string get_string(const std::string& key, const std::string& dflt) const;
  std::vector<double> get_double_list(const std::string& key) const;
  std::vector<std::string> get_string_list(const std::string& key) const;
  JsonObject get_object(const std::string& key) const;

 private:
  [[noreturn]] void wrong(const std::string& key, const char* expected) const;
  nlohmann::json j_;
  std::string where_;
};

// Bytes outside printable ASCII as \xNN (for error messages quoting untrusted input).
std::string printable(const std::string& text);

// A JSON number, or one of the strings "Infinity", "-Infinity", "NaN", or {"__float__": "..."}.
std::optional<double> as_double(const nlohmann::json& v);

}  // namespace replayssm::model
