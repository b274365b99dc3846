#include "io/npy.h"

#include "io/atomic_file.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

namespace replayssm::io {
namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw std::runtime_error(fmt::format("{}: {}", path, what));
}

// numpy.lib.format refuses headers longer than this many characters (its max_header_size).
constexpr std::size_t kMaxHeaderChars = 10000;

// ---- dtypes ----------------------------------------------------------------------------------

struct Dtype {
  std::string canonical;  // "<f4", "|u1", ...
  std::size_t size = 0;
  bool big_endian = false;
};

// The spellings numpy.dtype() accepts for the supported types: a type code, optionally after a
// byte-order character, or a type name on its own (numpy refuses "<float32").
const Dtype* find_dtype(const std::string& descr, Dtype& out) {
  struct Known {
    const char* canonical;
    std::size_t size;
    std::vector<std::string_view> codes, names;
  };
  static const std::vector<Known> known = {
      {"<f2", 2, {"f2", "e"}, {"float16", "half"}},
      {"<f4", 4, {"f4", "f"}, {"float32", "single"}},
      {"<f8", 8, {"f8", "d"}, {"float64", "double", "float"}},
      {"|i1", 1, {"i1", "b"}, {"int8", "byte"}},
      {"<i2", 2, {"i2", "h"}, {"int16", "short"}},
      {"<i4", 4, {"i4", "i"}, {"int32", "intc"}},
      {"<i8", 8, {"i8", "l", "q", "n", "p"}, {"int64", "int", "int_", "intp", "long", "longlong"}},
      {"|u1", 1, {"u1", "B"}, {"uint8", "ubyte"}},
      {"<u2", 2, {"u2", "H"}, {"uint16", "ushort"}},
      {"<u4", 4, {"u4", "I"}, {"uint32", "uintc"}},
      {"<u8", 8, {"u8", "L", "Q", "N", "P"}, {"uint64", "uint", "uintp", "ulong", "ulonglong"}},
  };
  const char order = descr.empty() ? '\0' : descr[0];
  const bool prefixed = order == '<' || order == '>' || order == '=' || order == '|';
  const std::string_view code = prefixed ? std::string_view(descr).substr(1) : std::string_view(descr);
  for (const Known& k : known) {
    const bool by_code = std::find(k.codes.begin(), k.codes.end(), code) != k.codes.end();
    const bool by_name = !prefixed && std::find(k.names.begin(), k.names.end(), code) != k.names.end();
    if (by_code || by_name) {
      out = Dtype{k.canonical, k.size, order == '>' && k.size > 1};
      return &out;
    }
  }
  return nullptr;
}

// ---- the header: a Python literal, as ast.literal_eval reads it ------------------------------------

struct PyValue {
  enum class Kind { string, bytes, integer, floating, complex, boolean, none, tuple, list, set, dict };
  Kind kind = Kind::none;
  std::string text;               // string / bytes content
  uint64_t magnitude = 0;         // integer
  bool negative = false, too_big = false, truth = false;
  bool signed_expression = false;  // -x or +x: literal_eval takes no sign on a sign
  std::vector<PyValue> items;     // tuple, list, set; dict: key, value, key, value, ...
  std::size_t begin = 0, end = 0;  // where it is in the header
};

struct HeaderSyntaxError {
  std::size_t pos;
  std::string what;
};

bool dec(char c) { return c >= '0' && c <= '9'; }

bool is_ident_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}

void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Strings (all quote styles, prefixes r/u/b, escapes, adjacent concatenation), numbers (decimal,
// hex, octal, binary, underscores, floats, imaginary, a sign, a + bj), True/False/None, tuples,
// lists, sets (and set()), dicts; comments and line continuations. python2_longs: numpy's retry
// for version 1.0/2.0 files drops an 'L' after a number.
class LiteralParser {
 public:
  LiteralParser(std::string_view s, bool python2_longs) : s_(s), python2_longs_(python2_longs) {}

  PyValue parse_document() {
    // literal_eval strips leading spaces and tabs; an indented later line is an IndentationError.
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
    skip_blank_lines();
    PyValue v = parse_expression();
    skip_space(true);
    if (pos_ != s_.size()) error("unexpected text after the dictionary");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& what) const { throw HeaderSyntaxError{pos_, what}; }
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  char peek(std::size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }

  void skip_blank_lines() {
    for (;;) {
      std::size_t p = pos_;
      while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t' || s_[p] == '\f')) ++p;
      if (p < s_.size() && s_[p] == '#')
        while (p < s_.size() && s_[p] != '\n' && s_[p] != '\r') ++p;
      if (p < s_.size() && (s_[p] == '\n' || s_[p] == '\r')) {
        pos_ = p + 1;
        continue;
      }
      if (p != pos_ && p < s_.size()) error("unexpected indentation");
      pos_ = p;
      return;
    }
  }

  // Inside brackets newlines are free; outside them (depth 0) a newline ends the expression.
  void skip_space(bool allow_newlines) {
    for (;;) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\f') {
        ++pos_;
      } else if ((c == '\n' || c == '\r') && (allow_newlines || depth_ > 0)) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n' && s_[pos_] != '\r') ++pos_;
      } else if (c == '\\' && (peek(1) == '\n' || peek(1) == '\r')) {
        pos_ += (peek(1) == '\r' && peek(2) == '\n') ? 3 : 2;
      } else {
        return;
      }
    }
  }

  PyValue parse_expression() {
    skip_space(false);
    const std::size_t begin = pos_;
    PyValue v = parse_signed();
    skip_space(false);
    // literal_eval's one binary operation: a real number plus or minus an imaginary constant.
    if ((at('+') || at('-')) && (v.kind == PyValue::Kind::integer || v.kind == PyValue::Kind::floating)) {
      ++pos_;
      skip_space(false);
      PyValue im = parse_atom();
      if (im.kind != PyValue::Kind::complex || im.signed_expression) error("expected an imaginary number after + or -");
      v = PyValue{};
      v.kind = PyValue::Kind::complex;
    }
    v.begin = begin;
    v.end = pos_;
    return v;
  }

  PyValue parse_signed() {
    if (at('+') || at('-')) {
      const bool minus = at('-');
      ++pos_;
      skip_space(false);
      PyValue v = parse_atom();
      const bool numeric = v.kind == PyValue::Kind::integer || v.kind == PyValue::Kind::floating ||
                           v.kind == PyValue::Kind::complex;
      if (!numeric || v.signed_expression) error("a sign must be followed by a number");
      if (minus && v.kind == PyValue::Kind::integer) v.negative = !v.negative && v.magnitude != 0;
      v.signed_expression = true;
      return v;
    }
    return parse_atom();
  }

  PyValue parse_atom() {
    skip_space(false);
    const char c = peek();
    if (c == '(' || c == '[' || c == '{') return parse_container();
    if ((c >= '0' && c <= '9') || (c == '.' && peek(1) >= '0' && peek(1) <= '9')) return parse_number();
    if (c == '\'' || c == '"' || is_ident_char(c)) return parse_word_or_string();
    if (pos_ >= s_.size()) error("unexpected end of the header");
    error(fmt::format("unexpected character '{}'", c));
  }

  PyValue parse_container() {
    const char open = s_[pos_++];
    const char close = open == '(' ? ')' : open == '[' ? ']' : '}';
    ++depth_;
    PyValue v;
    v.kind = open == '(' ? PyValue::Kind::tuple : open == '[' ? PyValue::Kind::list : PyValue::Kind::dict;
    skip_space(true);
    bool first = true, saw_comma = false;
    while (!at(close)) {
      if (!first && !saw_comma) error(fmt::format("expected ',' or '{}'", close));
      PyValue item = parse_expression();
      skip_space(true);
      if (open == '{') {
        if (first) v.kind = at(':') ? PyValue::Kind::dict : PyValue::Kind::set;
        check_hashable(item);
        v.items.push_back(std::move(item));
        if (v.kind == PyValue::Kind::dict) {
          if (!at(':')) error("expected ':' after a dictionary key");
          ++pos_;
          v.items.push_back(parse_expression());
          skip_space(true);
        }
      } else {
        v.items.push_back(std::move(item));
      }
      first = false;
      saw_comma = at(',');
      if (saw_comma) {
        ++pos_;
        skip_space(true);
      }
    }
    ++pos_;
    --depth_;
    if (open == '(' && v.items.size() == 1 && !saw_comma) return std::move(v.items[0]);  // (x) is x
    return v;
  }

  void check_hashable(const PyValue& v) const {
    if (v.kind == PyValue::Kind::list || v.kind == PyValue::Kind::dict || v.kind == PyValue::Kind::set)
      error("a list, dict or set cannot be a dictionary key or set element");
    for (const PyValue& item : v.items) check_hashable(item);
  }

  PyValue parse_number() {
    PyValue v;
    v.kind = PyValue::Kind::integer;
    const std::size_t start = pos_;
    auto digits = [&](auto is_digit) {  // digit (_? digit)*
      std::string out;
      if (!is_digit(peek())) error("malformed number");
      while (is_digit(peek()) || (peek() == '_' && is_digit(peek(1)))) {
        if (peek() != '_') out += peek();
        ++pos_;
      }
      return out;
    };
    auto accumulate = [&](const std::string& ds, unsigned base) {
      for (char d : ds) {
        const unsigned x = d <= '9' ? unsigned(d - '0') : unsigned((d | 0x20) - 'a' + 10);
        if (v.magnitude > (std::numeric_limits<uint64_t>::max() - x) / base) v.too_big = true;
        v.magnitude = v.magnitude * base + x;
      }
    };
    const char p1 = static_cast<char>(peek(1) | 0x20);
    if (peek() == '0' && (p1 == 'x' || p1 == 'o' || p1 == 'b')) {
      pos_ += 2;
      if (peek() == '_') ++pos_;
      if (p1 == 'x')
        accumulate(digits([](char c) { return dec(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }), 16);
      else if (p1 == 'o')
        accumulate(digits([](char c) { return c >= '0' && c <= '7'; }), 8);
      else
        accumulate(digits([](char c) { return c == '0' || c == '1'; }), 2);
    } else {
      const std::string whole = peek() == '.' ? std::string() : digits(dec);
      bool real = false;
      if (at('.')) {
        real = true;
        ++pos_;
        if (dec(peek())) digits(dec);
      }
      if (peek() == 'e' || peek() == 'E') {
        const std::size_t save = pos_;
        ++pos_;
        if (at('+') || at('-')) ++pos_;
        if (dec(peek())) {
          digits(dec);
          real = true;
        } else {
          pos_ = save;
        }
      }
      if (peek() == 'j' || peek() == 'J') {
        ++pos_;
        v.kind = PyValue::Kind::complex;
      } else if (real) {
        v.kind = PyValue::Kind::floating;
      } else {
        // "0123" is not Python; "000" is.
        if (whole.size() > 1 && whole[0] == '0' && whole.find_first_not_of('0') != std::string::npos) {
          pos_ = start;
          error("decimal integers may not have leading zeros");
        }
        accumulate(whole, 10);
      }
    }
    if (python2_longs_) {
      std::size_t p = pos_;
      while (p < s_.size() && (s_[p] == ' ' || s_[p] == '\t')) ++p;
      if (p < s_.size() && s_[p] == 'L' && (p + 1 >= s_.size() || !is_ident_char(s_[p + 1]))) pos_ = p + 1;
    }
    if (is_ident_char(peek())) error("malformed number");
    return v;
  }

  PyValue parse_word_or_string() {
    const std::size_t start = pos_;
    while (is_ident_char(peek())) ++pos_;
    const std::string word(s_.substr(start, pos_ - start));
    if (at('\'') || at('"')) {
      std::string prefix = word;
      for (char& c : prefix) c = static_cast<char>(c | 0x20);
      static const char* const valid[] = {"", "r", "u", "b", "br", "rb", "f", "fr", "rf"};
      if (std::find(std::begin(valid), std::end(valid), prefix) == std::end(valid)) error("unknown string prefix");
      if (prefix.find('f') != std::string::npos) error("an f-string is not a literal");
      return parse_strings(prefix.find('b') != std::string::npos, prefix.find('r') != std::string::npos);
    }
    PyValue v;
    if (word == "True" || word == "False") {
      v.kind = PyValue::Kind::boolean;
      v.truth = word == "True";
    } else if (word == "None") {
      v.kind = PyValue::Kind::none;
    } else if (word == "set") {  // literal_eval accepts set() for the empty set
      skip_space(false);
      if (!at('(')) error("'set' is not a literal");
      ++pos_;
      skip_space(true);
      if (!at(')')) error("only the empty set() is a literal");
      ++pos_;
      v.kind = PyValue::Kind::set;
    } else {
      pos_ = start;
      error(fmt::format("'{}' is not a literal", word));
    }
    return v;
  }

  // One string literal and any adjacent ones (Python concatenates them; str and bytes cannot mix).
  PyValue parse_strings(bool bytes, bool raw) {
    PyValue v;
    v.kind = bytes ? PyValue::Kind::bytes : PyValue::Kind::string;
    for (;;) {
      parse_one_string(bytes, raw, v.text);
      const std::size_t save = pos_;
      skip_space(false);
      const std::size_t start = pos_;
      while (is_ident_char(peek())) ++pos_;
      std::string prefix(s_.substr(start, pos_ - start));
      for (char& c : prefix) c = static_cast<char>(c | 0x20);
      if (!(at('\'') || at('"')) || prefix.size() > 2) {
        pos_ = save;
        return v;
      }
      static const char* const valid[] = {"", "r", "u", "b", "br", "rb"};
      if (std::find(std::begin(valid), std::end(valid), prefix) == std::end(valid)) error("unknown string prefix");
      const bool next_bytes = prefix.find('b') != std::string::npos;
      if (next_bytes != bytes) error("cannot mix bytes and str literals");
      raw = prefix.find('r') != std::string::npos;
    }
  }

  void parse_one_string(bool bytes, bool raw, std::string& out) {
    const char q = s_[pos_];
    const bool triple = peek(1) == q && peek(2) == q;
    pos_ += triple ? 3 : 1;
    for (;;) {
      if (pos_ >= s_.size()) error("unterminated string");
      const char c = s_[pos_];
      if (c == q && (!triple || (peek(1) == q && peek(2) == q))) {
        pos_ += triple ? 3 : 1;
        return;
      }
      if ((c == '\n' || c == '\r') && !triple) error("unterminated string");
      if (bytes && static_cast<unsigned char>(c) >= 0x80) error("bytes literals may contain only ASCII");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      const char e = peek(1);
      if (e == '\0' && pos_ + 1 >= s_.size()) error("unterminated string");
      if (raw) {  // a backslash stays, and keeps the next character from ending the string
        out += c;
        out += e;
        pos_ += 2;
        continue;
      }
      pos_ += 2;
      switch (e) {
        case '\n': break;
        case '\r': if (at('\n')) ++pos_; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
          if (bytes)
            out += static_cast<char>(hex_escape(2));
          else
            append_utf8(out, hex_escape(2));
          break;
        case 'u':
        case 'U':
          if (bytes) {
            out += '\\';
            out += e;
          } else {
            append_utf8(out, hex_escape(e == 'u' ? 4 : 8));
          }
          break;
        case 'N':
          if (!bytes) error("\\N{...} escapes are not supported in a .npy header");
          out += "\\N";
          break;
        default:
          if (e >= '0' && e <= '7') {
            unsigned x = static_cast<unsigned>(e - '0');
            for (int i = 0; i < 2 && peek() >= '0' && peek() <= '7'; ++i) x = x * 8 + unsigned(s_[pos_++] - '0');
            if (bytes)
              out += static_cast<char>(x & 0xFF);
            else
              append_utf8(out, x);
          } else {  // an unknown escape keeps its backslash
            out += '\\';
            out += e;
          }
      }
    }
  }

  uint32_t hex_escape(int n) {
    uint32_t x = 0;
    for (int i = 0; i < n; ++i) {
      const char c = peek();
      const int d = (c >= '0' && c <= '9') ? c - '0' : ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') ? (c | 0x20) - 'a' + 10 : -1;
      if (d < 0) error("truncated \\x, \\u or \\U escape");
      x = x * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (x > 0x10FFFF) error("escape beyond the Unicode range");
    return x;
  }

  std::string_view s_;
  bool python2_longs_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

// The header text for a message: printable ASCII as is, the rest escaped, long text cut.
std::string shown(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7F)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > 200) out += "...";
  return out;
}

std::size_t utf8_length(std::string_view s, bool& valid) {
  std::size_t chars = 0;
  valid = true;
  for (std::size_t i = 0; i < s.size(); ++chars) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) {
      valid = false;
      return chars;
    }
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) >> 6) != 0x2) valid = false;
    i += n;
  }
  return chars;
}

struct Header {
  Dtype dtype;
  std::vector<std::size_t> shape;
  bool fortran_order = false;
};

Header parse_header(const std::string& path, const std::string& header, int major) {
  std::string_view h(header);
  PyValue dict;
  try {
    dict = LiteralParser(h, major <= 2).parse_document();
  } catch (const HeaderSyntaxError& e) {
    fail(path, fmt::format(".npy header is not a Python dictionary literal: {} at byte {} of \"{}\"", e.what, e.pos,
                           shown(h)));
  }
  if (dict.kind != PyValue::Kind::dict)
    fail(path, fmt::format(".npy header is not a dictionary: \"{}\"", shown(h)));

  // Python keeps the last value of a repeated key.
  std::map<std::string, const PyValue*> fields;
  for (std::size_t i = 0; i < dict.items.size(); i += 2) {
    const PyValue& key = dict.items[i];
    if (key.kind != PyValue::Kind::string)
      fail(path, fmt::format(".npy header key {} is not a string: expected exactly the keys 'descr', "
                             "'fortran_order' and 'shape'",
                             shown(h.substr(key.begin, key.end - key.begin))));
    fields[key.text] = &dict.items[i + 1];
  }
  std::string keys;
  for (const auto& [k, v] : fields) keys += (keys.empty() ? "'" : ", '") + shown(k) + "'";
  if (fields.size() != 3 || !fields.count("descr") || !fields.count("fortran_order") || !fields.count("shape"))
    fail(path, fmt::format(".npy header has the keys [{}]: expected exactly 'descr', 'fortran_order' and 'shape'",
                           keys));
  auto text_of = [&](const PyValue& v) { return shown(h.substr(v.begin, v.end - v.begin)); };

  Header out;
  const PyValue& descr = *fields["descr"];
  if (descr.kind == PyValue::Kind::list)
    fail(path, fmt::format(".npy header field 'descr' is a structured dtype {}: expected a plain numeric dtype such "
                           "as '<f4'",
                           text_of(descr)));
  if (descr.kind != PyValue::Kind::string || !find_dtype(descr.text, out.dtype))
    fail(path, fmt::format(".npy header field 'descr' is {}: expected a numeric dtype string (float16/32/64, "
                           "int8-64 or uint8-64, e.g. '<f4')",
                           text_of(descr)));

  const PyValue& fortran = *fields["fortran_order"];
  if (fortran.kind != PyValue::Kind::boolean)
    fail(path, fmt::format(".npy header field 'fortran_order' is {}: expected True or False", text_of(fortran)));
  out.fortran_order = fortran.truth;

  const PyValue& shape = *fields["shape"];
  if (shape.kind != PyValue::Kind::tuple)
    fail(path, fmt::format(".npy header field 'shape' is {}: expected a tuple of non-negative integers",
                           text_of(shape)));
  for (const PyValue& d : shape.items) {
    if (d.kind != PyValue::Kind::integer || d.negative || d.too_big ||
        d.magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(path, fmt::format(".npy header field 'shape' is {}: expected a tuple of non-negative integers below "
                             "2^63, found {}",
                             text_of(shape), text_of(d)));
    out.shape.push_back(static_cast<std::size_t>(d.magnitude));
  }
  return out;
}


// Fortran order to C order: element (i0, ..., ik) is at sum i_j * prod(d_<j) in the file.
std::vector<uint8_t> fortran_to_c(const std::vector<uint8_t>& in, const std::vector<std::size_t>& shape,
                                  std::size_t esize) {
  std::vector<uint8_t> out(in.size());
  const std::size_t n = in.size() / esize, k = shape.size();
  std::vector<std::size_t> index(k, 0), stride(k, 1);
  for (std::size_t j = 1; j < k; ++j) stride[j] = stride[j - 1] * shape[j - 1];
  std::size_t src = 0;
  for (std::size_t dst = 0; dst < n; ++dst) {
    std::memcpy(out.data() + dst * esize, in.data() + src * esize, esize);
    for (std::size_t j = k; j-- > 0;) {  // odometer over C order, tracking the Fortran offset
      if (++index[j] < shape[j]) {
        src += stride[j];
        break;
      }
      src -= (shape[j] - 1) * stride[j];
      index[j] = 0;
    }
  }
  return out;
}

}  // namespace

std::string shape_text(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::size_t checked_element_count(const std::vector<std::size_t>& shape, std::size_t elem_size,
                                  const std::string& what) {
  // numpy's rule: the byte size of the non-zero dimensions must fit in int64, even when another
  // dimension is zero.
  const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t bytes = elem_size == 0 ? 1 : elem_size;
  bool empty = false;
  for (std::size_t d : shape) {
    if (d == 0) {
      empty = true;
      continue;
    }
    if (bytes > limit / d)
      throw std::invalid_argument(fmt::format("{}: shape {} has more than 2^63 bytes of {}-byte elements", what,
                                              shape_text(shape), elem_size));
    bytes *= d;
  }
  return empty ? 0 : static_cast<std::size_t>(bytes / (elem_size == 0 ? 1 : elem_size));
}

std::size_t NpyArray::element_count() const {
  std::size_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

NpyArray read_npy(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) fail(path, "is a directory, expected a .npy file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, fmt::format("cannot open for reading: {}", std::strerror(errno)));
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) fail(path, fmt::format("cannot read the file size: {}", ec.message()));

  char magic[8];
  if (!in.read(magic, 8)) fail(path, "not a .npy file (shorter than the 8-byte magic string)");
  if (std::memcmp(magic, "\x93NUMPY", 6) != 0) fail(path, "not a .npy file (the magic string \\x93NUMPY is missing)");
  const int major = static_cast<unsigned char>(magic[6]), minor = static_cast<unsigned char>(magic[7]);
  if ((major < 1 || major > 3) || minor != 0)
    fail(path, fmt::format("unsupported .npy format version {}.{} (expected 1.0, 2.0 or 3.0)", major, minor));
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  unsigned char b[4] = {};
  if (!in.read(reinterpret_cast<char*>(b), static_cast<std::streamsize>(length_bytes)))
    fail(path, "truncated .npy file: it ends inside the header length field");
  const uint64_t header_len = b[0] | (b[1] << 8) | (uint64_t{b[2]} << 16) | (uint64_t{b[3]} << 24);
  const uint64_t preamble = 8 + length_bytes;
  // Bounded before allocating: numpy's limit is 10000 characters (UTF-8: at most 4 bytes each).
  if (header_len > 4 * kMaxHeaderChars)
    fail(path, fmt::format(".npy header length field says {} bytes: expected at most {} characters (numpy's limit)",
                           header_len, kMaxHeaderChars));
  if (preamble + header_len > file_size)
    fail(path, fmt::format("truncated .npy file: the header length field says {} bytes, the file has {} after the "
                           "{}-byte preamble",
                           header_len, file_size - preamble, preamble));
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) fail(path, "read error in the .npy header");
  bool valid_utf8 = true;
  const std::size_t chars = major == 3 ? utf8_length(header, valid_utf8) : header.size();
  if (!valid_utf8) fail(path, ".npy header of a version 3.0 file is not valid UTF-8");
  if (chars > kMaxHeaderChars)
    fail(path, fmt::format(".npy header is {} characters: expected at most {} (numpy's limit)", chars, kMaxHeaderChars));

  const Header h = parse_header(path, header, major);
  NpyArray a;
  a.dtype = h.dtype.canonical;
  a.shape = h.shape;
  std::size_t count = 0;
  try {
    count = checked_element_count(a.shape, h.dtype.size, path);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(e.what());
  }
  const uint64_t bytes = uint64_t{count} * h.dtype.size;
  const uint64_t available = file_size - preamble - header_len;
  if (bytes > available)
    fail(path, fmt::format("truncated data: the header promises {} bytes (shape {} of {}), the file has {}", bytes,
                           shape_text(a.shape), a.dtype, available));
  if (bytes < available)
    fail(path, fmt::format("{} bytes after the data: the header's shape {} of {} accounts for {} of the {} data bytes",
                           available - bytes, shape_text(a.shape), a.dtype, bytes, available));
  a.data.resize(bytes);
  if (bytes && !in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(bytes)))
    fail(path, "read error in the .npy data");
  if (h.dtype.big_endian)
    for (std::size_t i = 0; i < bytes; i += h.dtype.size) std::reverse(&a.data[i], &a.data[i] + h.dtype.size);
  if (h.fortran_order && a.shape.size() > 1 && count > 0) a.data = fortran_to_c(a.data, a.shape, h.dtype.size);
  return a;
}

NpyArray read_npy_float32(const std::string& path) {
  NpyArray a = read_npy(path);
  if (a.dtype != "<f4")
    fail(path, fmt::format("dtype is '{}', expected float32 ('<f4'); convert with arr.astype(np.float32)", a.dtype));
  return a;
}

std::vector<float> as_floats(const NpyArray& a) {
  std::vector<float> v(a.data.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), a.data.data(), v.size() * sizeof(float));
  return v;
}

NpyWriter::NpyWriter(const std::string& path, const std::string& dtype, const std::vector<std::size_t>& shape,
                     bool replace_existing)
    : file_(std::make_unique<AtomicFile>(path, replace_existing)) {
  Dtype d;
  if (!find_dtype(dtype, d) || d.canonical != dtype)
    throw std::invalid_argument(fmt::format("{}: cannot write dtype '{}' (expected a canonical little-endian descr "
                                            "such as '<f4')",
                                            path, dtype));
  expected_ = checked_element_count(shape, d.size, path) * d.size;
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", dtype, shape_text(shape));
  // As numpy writes it: padded with spaces to a multiple of 64 bytes, ending in '\n'; version 2.0
  // only when the header does not fit version 1.0's 16-bit length.
  const bool v1 = 10 + header.size() + 1 + 63 <= 0xFFFF;
  const std::size_t preamble = v1 ? 10 : 12;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string prefix = std::string("\x93NUMPY", 6) + static_cast<char>(v1 ? 1 : 2) + '\0';
  const std::size_t len = header.size();
  for (std::size_t i = 0; i < (v1 ? 2u : 4u); ++i) prefix += static_cast<char>((len >> (8 * i)) & 0xFF);
  file_->write(prefix);
  file_->write(header);
}

NpyWriter::~NpyWriter() = default;

void NpyWriter::write(const void* data, std::size_t bytes) {
  if (bytes > expected_ - written_)
    throw std::logic_error(fmt::format("{}: more data than the shape holds ({} bytes)", file_->path(), expected_));
  file_->write(data, bytes);
  written_ += bytes;
}

void NpyWriter::finish() {
  if (written_ != expected_)
    throw std::logic_error(
        fmt::format("{}: {} bytes of data written, the shape needs {}", file_->path(), written_, expected_));
  file_->sync();
}

void NpyWriter::commit() {
  finish();
  file_->commit();
}

void write_npy(const std::string& path, const std::string& dtype, const std::vector<std::size_t>& shape,
               const void* data, std::size_t bytes) {
  NpyWriter w(path, dtype, shape);
  w.write(data, bytes);
  w.commit();
}

void write_npy_float32(const std::string& path, const std::vector<std::size_t>& shape, const float* data) {
  write_npy(path, "<f4", shape, data, checked_element_count(shape, sizeof(float), path) * sizeof(float));
}

}  // namespace replayssm::io
