#include "model/json_util.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

namespace replayssm::model {
namespace {

// Python's json module writes inf and nan as bare Infinity / -Infinity / NaN. Quote them
// (outside strings only) so that a standard parser accepts the text.
std::string quote_python_literals(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size())
        out += text[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
      out += c;
      continue;
    }
    bool replaced = false;
    for (const char* lit : {"-Infinity", "Infinity", "NaN"}) {
      const std::string l(lit);
      if (text.compare(i, l.size(), l) == 0) {
        out += '"' + l + '"';
        i += l.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f)
      out += ch;
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

nlohmann::json read_json_file(const std::string& path) {
  // Checked before opening: a directory would read as empty text ("not valid JSON"), a FIFO
  // would block forever.
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st) && fs::is_symlink(fs::symlink_status(path, ec)))
    throw std::runtime_error(
        fmt::format("{}: is a broken symbolic link to '{}', expected a JSON file", path, fs::read_symlink(path, ec).string()));
  if (fs::is_directory(st)) throw std::runtime_error(fmt::format("{}: is a directory, expected a JSON file", path));
  if (fs::exists(st) && !fs::is_regular_file(st))
    throw std::runtime_error(fmt::format("{}: is not a regular file, expected a JSON file", path));
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error(fmt::format("{}: cannot open", path));
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return nlohmann::json::parse(quote_python_literals(ss.str()));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("{}: not valid JSON: {}", path, printable(e.what())));
  }
}

std::optional<double> as_double(const nlohmann::json& v) {
  if (v.is_number()) return v.get<double>();
  const nlohmann::json* s = &v;
  if (v.is_object() && v.size() == 1 && v.contains("__float__")) s = &v["__float__"];
  if (s->is_string()) {
    const std::string t = s->get<std::string>();
    if (t == "Infinity" || t == "inf") return std::numeric_limits<double>::infinity();
    if (t == "-Infinity" || t == "-inf") return -std::numeric_limits<double>::infinity();
    if (t == "NaN" || t == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  return std::nullopt;
}

JsonObject::JsonObject(nlohmann::json j, std::string where) : j_(std::move(j)), where_(std::move(where)) {
  if (!j_.is_object()) throw std::runtime_error(fmt::format("{}: expected a JSON object", where_));
}

bool JsonObject::has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

void JsonObject::wrong(const std::string& key, const char* expected) const {
  if (!has(key))
    throw std::runtime_error(fmt::format("{}: missing config key \"{}\" (expected {})", where_, key, expected));
  throw std::runtime_error(
      fmt::format("{}: config key \"{}\" is {}, expected {}", where_, key, j_[key].dump(), expected));
}

int64_t JsonObject::get_int(const std::string& key) const {
  if (!has(key)) wrong(key, "an integer");
  const auto& v = j_[key];
  // Unsigned values above INT64_MAX would wrap negative.
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    wrong(key, "an integer (of at most 9223372036854775807)");
  if (v.is_number_integer()) return v.get<int64_t>();
  // An integral float (8.0) is accepted; the range test comes before the cast, which is
  // undefined for NaN, infinities and values outside [-2^63, 2^63).
  if (v.is_number_float()) {
    const double d = v.get<double>();
    constexpr double two63 = 9223372036854775808.0;
    if (std::isfinite(d) && d >= -two63 && d < two63 && std::trunc(d) == d) return static_cast<int64_t>(d);
  }
  wrong(key, "an integer");
}
double JsonObject::get_double(const std::string& key) const {
  if (!has(key)) wrong(key, "a number");
  if (auto d = as_double(j_[key])) return *d;
  wrong(key, "a number");
}
bool JsonObject::get_bool(const std::string& key) const {
  if (!has(key) || !j_[key].is_boolean()) wrong(key, "true or false");
  return j_[key].get<bool>();
}
std::string JsonObject::get_string(const std::string& key) const {
  if (!has(key) || !j_[key].is_string()) wrong(key, "a string");
  return j_[key].get<std::string>();
}
int64_t JsonObject::get_int(const std::string& key, int64_t dflt) const { return has(key) ? get_int(key) : dflt; }
double JsonObject::get_double(const std::string& key, double dflt) const { return has(key) ? get_double(key) : dflt; }
bool JsonObject::get_bool(const std::string& key, bool dflt) const { return has(key) ? get_bool(key) : dflt; }
std::string JsonObject::get_string(const std::string& key, const std::string& dflt) const {
  return has(key) ? get_string(key) : dflt;
}
std::vector<double> JsonObject::get_double_list(const std::string& key) const {
  if (!has(key) || !j_[key].is_array()) wrong(key, "a list of numbers");
  std::vector<double> out;
  for (const auto& v : j_[key]) {
    auto d = as_double(v);
    if (!d) wrong(key, "a list of numbers");
    out.push_back(*d);
  }
  return out;
}
std::vector<std::string> JsonObject::get_string_list(const std::string& key) const {
  if (!has(key) || !j_[key].is_array()) wrong(key, "a list of strings");
  std::vector<std::string> out;
  for (const auto& v : j_[key]) {
    if (!v.is_string()) wrong(key, "a list of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}
JsonObject JsonObject::get_object(const std::string& key) const {
  if (!has(key) || !j_[key].is_object()) wrong(key, "an object");
  return JsonObject(j_[key], where_ + ": " + key);
}

}  // namespace replayssm::model
