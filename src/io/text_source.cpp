// Token directory written by scripts/tokenize_text.py (format "replayssm-tokens", version 1):
//   DIR/manifest.json  {"format": "replayssm-tokens", "version": 1, "strip": "gutenberg-v1",
//                       "tokenizer": NAME, "tokenizer_class": ..., "vocab_size": V, "add_bos": bool,
//                       "books": [{"name", "source", "tokens": "NAME.npy", "n_tokens",
//                                  "text_bytes", "text_fnv1a64": "16 hex digits", "encoding"}]}
//   DIR/NAME.npy       1-D int32 (or int64/uint16/uint32) token ids of the whole stripped book.
#include "io/text_source.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/npy.h"

namespace replayssm::io {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTextDirHint =
    "point --text-dir at a folder of PG-19 .txt books, e.g. ../shared/data/pg19/test";

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string_view ltrim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

bool is_blank(std::string_view s) {
  for (char c : s)
    if (!is_space(c) && c != '\r') return false;
  return true;
}

// Case-insensitive prefix match; on success removes the prefix from s.
bool consume(std::string_view& s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i)
    if (lower(s[i]) != lower(prefix[i])) return false;
  s.remove_prefix(prefix.size());
  return true;
}

// Consumes words separated by runs of spaces/tabs (at least one between words).
bool consume_words(std::string_view& s, std::initializer_list<std::string_view> words) {
  std::string_view t = s;
  bool first = true;
  for (std::string_view w : words) {
    if (!first) {
      if (t.empty() || !is_space(t.front())) return false;
      t = ltrim(t);
    }
    if (!consume(t, w)) return false;
    first = false;
  }
  s = t;
  return true;
}

// VERB [THE|THIS] PROJECT GUTENBERG. `verb` is two words ("START", "OF").
bool phrase(std::string_view& s, std::string_view verb1, std::string_view verb2) {
  std::string_view t = s;
  if (!consume_words(t, {verb1, verb2})) return false;
  std::string_view u = t;
  if (consume_words(u, {"", "the", "project", "gutenberg"}) || consume_words(u, {"", "this", "project", "gutenberg"}) ||
      consume_words(u, {"", "project", "gutenberg"})) {
    s = u;
    return true;
  }
  return false;
}

// Three or more '*' then spaces; returns false (s untouched) when the line does not start so.
bool consume_stars(std::string_view& s) {
  std::size_t n = 0;
  while (n < s.size() && s[n] == '*') ++n;
  if (n < 3) return false;
  s = ltrim(s.substr(n));
  return true;
}

// Header marker: returns true and whether the marker is closed on this line.
bool header_marker(std::string_view line, bool& closed) {
  std::string_view t = ltrim(line);
  {
    std::string_view u = t;
    if (consume(u, "*END*THE SMALL PRINT")) {
      closed = true;
      return true;
    }
  }
  if (!consume_stars(t)) return false;
  if (!phrase(t, "start", "of")) return false;
  closed = t.find("***") != std::string_view::npos;
  return true;
}

bool footer_marker(std::string_view line) {
  std::string_view t = ltrim(line);
  std::string_view u = t;
  if (consume_stars(u) && phrase(u, "end", "of")) return true;
  return phrase(t, "end", "of");
}

std::string lowercase(std::string s) {
  for (char& c : s) c = lower(c);
  return s;
}

bool ends_with_txt(const std::string& name) {
  const std::string l = lowercase(name);
  return l.size() > 4 && l.compare(l.size() - 4, 4, ".txt") == 0;
}

bool is_corpus_note(const std::string& name) {
  const std::string l = lowercase(name);
  return l.rfind("readme", 0) == 0 || l.rfind("sources", 0) == 0 || l.rfind("license", 0) == 0;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("{}: cannot open for reading", p.string()));
  std::ostringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

std::vector<int32_t> npy_token_ids(const std::string& path) {
  const NpyArray a = read_npy(path);
  if (a.shape.size() != 1)
    throw std::runtime_error(fmt::format("{}: expected a 1-D array of token ids, got {} dimensions", path,
                                         a.shape.size()));
  const std::size_t n = a.shape[0];
  std::vector<int32_t> ids(n);
  auto convert = [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, a.data.data() + i * sizeof(T), sizeof(T));
      if (v < 0 || static_cast<uint64_t>(v) > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
        throw std::runtime_error(
            fmt::format("{}: token id {} at index {} is outside [0, 2^31): not a token id", path, v, i));
      ids[i] = static_cast<int32_t>(v);
    }
  };
  if (a.dtype == "<i4")
    convert(int32_t{});
  else if (a.dtype == "<i8")
    convert(int64_t{});
  else if (a.dtype == "<u2")
    convert(uint16_t{});
  else if (a.dtype == "<u4")
    convert(uint32_t{});
  else
    throw std::runtime_error(
        fmt::format("{}: token ids must be int32, int64, uint16 or uint32, got dtype '{}'", path, a.dtype));
  return ids;
}

struct ManifestBook {
  std::string npy;
  int64_t n_tokens = -1;
  std::string text_hash;
};

}  // namespace

StrippedText strip_gutenberg(std::string_view raw, const std::string& name) {
  StrippedText out;
  if (raw.size() >= 3 && static_cast<unsigned char>(raw[0]) == 0xEF && static_cast<unsigned char>(raw[1]) == 0xBB &&
      static_cast<unsigned char>(raw[2]) == 0xBF) {
    raw.remove_prefix(3);
    out.had_bom = true;
  }
  std::string text;
  text.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r' && i + 1 < raw.size() && raw[i + 1] == '\n') {
      out.had_crlf = true;
      continue;
    }
    text.push_back(raw[i]);
  }

  std::vector<std::string_view> lines;
  {
    std::string_view rest = text;
    while (!rest.empty()) {
      const std::size_t nl = rest.find('\n');
      lines.push_back(rest.substr(0, nl));
      if (nl == std::string_view::npos) break;
      rest.remove_prefix(nl + 1);
    }
  }

  std::size_t begin = 0, end = lines.size();
  for (std::size_t i = 0; i < lines.size(); ++i) {
    bool closed = false;
    if (!header_marker(lines[i], closed)) continue;
    out.header_found = true;
    begin = i + 1;
    if (!closed) {
      for (std::size_t j = i + 1; j < lines.size() && j <= i + 3; ++j) {
        if (is_blank(lines[j])) break;
        if (lines[j].find("***") != std::string_view::npos) {
          begin = j + 1;
          break;
        }
      }
    }
    break;
  }
  for (std::size_t i = begin; i < lines.size(); ++i) {
    if (footer_marker(lines[i])) {
      out.footer_found = true;
      end = i;
      break;
    }
  }
  if (out.footer_found && !out.header_found)
    throw std::runtime_error(fmt::format(
        "{}: has a Project Gutenberg footer (\"*** END OF ...\" / \"End of the Project Gutenberg ...\") but no "
        "\"*** START OF ...\" header marker, so where the book begins is unknown; strip the header by hand or "
        "remove the file",
        name));
  while (begin < end && is_blank(lines[begin])) ++begin;
  while (end > begin && is_blank(lines[end - 1])) --end;
  if (begin == end)
    throw std::runtime_error(fmt::format(
        "{}: empty after removing the Project Gutenberg header and footer (header marker {}, footer marker {})", name,
        out.header_found ? "found" : "not found", out.footer_found ? "found" : "not found"));
  std::size_t bytes = 0;
  for (std::size_t i = begin; i < end; ++i) bytes += lines[i].size() + 1;
  out.text.reserve(bytes);
  for (std::size_t i = begin; i < end; ++i) {
    out.text.append(lines[i]);
    out.text.push_back('\n');
  }
  return out;
}

uint64_t fnv1a64(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t fnv1a64(const int32_t* ids, std::size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    const uint32_t v = static_cast<uint32_t>(ids[i]);
    for (int b = 0; b < 4; ++b) {
      h ^= (v >> (8 * b)) & 0xFFu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

namespace {

std::string_view file_kind(fs::file_type t) {
  switch (t) {
    case fs::file_type::fifo: return "a FIFO";
    case fs::file_type::socket: return "a socket";
    case fs::file_type::block: return "a block device";
    case fs::file_type::character: return "a character device";
    default: return "not a regular file";
  }
}

}  // namespace

std::vector<fs::path> list_book_files(const std::string& dir) {
  std::error_code ec;
  if (dir.empty()) throw std::runtime_error(fmt::format("no text found: no directory given; {}", kTextDirHint));
  if (!fs::exists(dir, ec))
    throw std::runtime_error(fmt::format("no text found in {}: the directory does not exist; {}", dir, kTextDirHint));
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error(fmt::format("no text found in {}: not a directory; {}", dir, kTextDirHint));
  std::vector<fs::path> files;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    if (!ends_with_txt(name) || is_corpus_note(name)) continue;
    std::error_code status_ec;
    const fs::file_status status = entry.status(status_ec);  // follows symbolic links
    if (status.type() == fs::file_type::not_found && entry.is_symlink(status_ec)) {
      std::error_code link_ec;
      const fs::path target = fs::read_symlink(entry.path(), link_ec);
      throw std::runtime_error(fmt::format("{}: a broken symbolic link (to '{}', which does not exist); fix or remove "
                                           "it",
                                           entry.path().string(), target.string()));
    }
    if (status_ec)
      throw std::runtime_error(fmt::format("{}: cannot be read as a book: {}", entry.path().string(),
                                           status_ec.message()));
    if (status.type() == fs::file_type::directory) continue;
    if (status.type() != fs::file_type::regular)
      throw std::runtime_error(fmt::format("{}: {}, not a book file", entry.path().string(), file_kind(status.type())));
    files.push_back(entry.path());
  }
  if (ec) throw std::runtime_error(fmt::format("no text found in {}: cannot list it: {}", dir, ec.message()));
  if (files.empty())
    throw std::runtime_error(fmt::format("no text found in {}: no .txt books in it; {}", dir, kTextDirHint));
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  // "a.txt" and "a.TXT" are both book "a": results are keyed by book name.
  std::map<std::string, std::string> by_name;  // book name -> file name
  for (const fs::path& f : files) {
    const auto [it, inserted] = by_name.emplace(f.stem().string(), f.filename().string());
    if (!inserted)
      throw std::runtime_error(fmt::format("{}: {} and {} are both book '{}'; keep one of them", dir, it->second,
                                           f.filename().string(), it->first));
  }
  return files;
}

ShortBooks parse_short_books(std::string_view text) {
  if (text == "error") return ShortBooks::error;
  if (text == "skip") return ShortBooks::skip;
  throw std::invalid_argument(fmt::format("--short-books: expected 'error' or 'skip', got '{}'", text));
}

std::vector<int32_t> byte_tokens(std::string_view text, int32_t offset) {
  if (offset < 0 || offset > kMaxByteOffset)
    throw std::invalid_argument(fmt::format(
        "--byte-offset {} is outside [0, {}]: id = byte value (0-255) + offset must be an int32 token id", offset,
        kMaxByteOffset));
  std::vector<int32_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<int32_t>(static_cast<unsigned char>(text[i])) + offset;
  return ids;
}

LoadedBooks load_books(const TextSourceOptions& o) {
  if (o.byte_offset < 0 || o.byte_offset > kMaxByteOffset)
    throw std::invalid_argument(fmt::format(
        "--byte-offset {} is outside [0, {}]: id = byte value (0-255) + offset must be an int32 token id",
        o.byte_offset, kMaxByteOffset));
  if (o.max_books < 0) throw std::invalid_argument(fmt::format("--books must be >= 0, got {}", o.max_books));
  if (o.length < 0 || o.length > kMaxLength)
    throw std::invalid_argument(fmt::format("--length {} is outside [0, {}]", o.length, kMaxLength));
  const std::vector<fs::path> files = list_book_files(o.text_dir);

  LoadedBooks out;
  std::map<std::string, ManifestBook> manifest;  // by source file name
  if (o.tokens_dir.empty()) {
    out.tokenizer = "bytes";
    out.tokenization = fmt::format("bytes (id = byte value + {})", o.byte_offset);
  } else {
    const fs::path mpath = fs::path(o.tokens_dir) / "manifest.json";
    if (!fs::exists(mpath))
      throw std::runtime_error(fmt::format(
          "{}: no manifest.json: --tokens-dir must be a folder written by scripts/tokenize_text.py", o.tokens_dir));
    out.manifest_json = read_file(mpath);
    nlohmann::json m;
    try {
      m = nlohmann::json::parse(out.manifest_json);
      if (m.value("format", std::string()) != "replayssm-tokens")
        throw std::runtime_error("field \"format\" is not \"replayssm-tokens\"");
      if (m.value("version", 0) != 1)
        throw std::runtime_error(fmt::format("unsupported version {} (this build reads 1)", m.value("version", 0)));
      if (m.value("strip", std::string()) != "gutenberg-v1")
        throw std::runtime_error(fmt::format("stripping '{}' is not this build's 'gutenberg-v1'",
                                             m.value("strip", std::string())));
      out.tokenizer = m.at("tokenizer").get<std::string>();
      if (!m.at("books").is_array()) throw std::runtime_error("field \"books\" is not an array");
      for (const auto& b : m.at("books")) {
        ManifestBook mb;
        mb.npy = b.at("tokens").get<std::string>();
        // scripts/tokenize_text.py writes NAME.npy beside the manifest; nothing else is read.
        if (mb.npy.empty() || fs::path(mb.npy).filename() != fs::path(mb.npy) || mb.npy == "." || mb.npy == "..")
          throw std::runtime_error(fmt::format("\"tokens\": \"{}\" is not a file name inside {}", mb.npy,
                                               o.tokens_dir));
        mb.n_tokens = b.at("n_tokens").get<int64_t>();
        mb.text_hash = b.at("text_fnv1a64").get<std::string>();
        const std::string source = b.at("source").get<std::string>();
        if (!manifest.emplace(source, mb).second)
          throw std::runtime_error(fmt::format("book \"{}\" is listed twice", source));
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("{}: malformed token manifest: {}", mpath.string(), e.what()));
    }
    out.tokenization = fmt::format("tokenizer {} (ids from {})", out.tokenizer, o.tokens_dir);
  }

  const std::size_t wanted = o.max_books == 0 ? files.size() : static_cast<std::size_t>(o.max_books);
  for (const fs::path& file : files) {
    if (out.books.size() == wanted) break;
    Book b;
    b.source = file.filename().string();
    b.name = file.stem().string();
    const StrippedText st = strip_gutenberg(read_file(file), file.string());
    b.text_hash = fnv1a64(st.text);
    b.text_bytes = static_cast<int64_t>(st.text.size());
    b.header_found = st.header_found;
    b.footer_found = st.footer_found;
    if (o.tokens_dir.empty()) {
      b.tokens = byte_tokens(st.text, o.byte_offset);
    } else {
      const auto it = manifest.find(b.source);
      if (it == manifest.end())
        throw std::runtime_error(fmt::format(
            "{}: book {} is not in the token manifest (it lists {} books): re-run scripts/tokenize_text.py on {}",
            o.tokens_dir, b.source, manifest.size(), o.text_dir));
      if (it->second.text_hash != hex64(b.text_hash))
        throw std::runtime_error(fmt::format(
            "{}: the tokens of {} were made from different text (stripped-text FNV-1a {} in the manifest, {} here): "
            "the book changed or the two strippers disagree; re-run scripts/tokenize_text.py",
            o.tokens_dir, b.source, it->second.text_hash, hex64(b.text_hash)));
      const std::string npy = (fs::path(o.tokens_dir) / it->second.npy).string();
      b.tokens = npy_token_ids(npy);
      if (it->second.n_tokens != static_cast<int64_t>(b.tokens.size()))
        throw std::runtime_error(fmt::format("{}: holds {} token ids, the manifest says {}", npy, b.tokens.size(),
                                             it->second.n_tokens));
    }
    const auto n = static_cast<int64_t>(b.tokens.size());
    if (n <= o.length) {  // short: fewer than length + 1 tokens
      const std::string what = fmt::format(
          "{}: {} tokens after stripping ({} bytes of text), but --length {} needs {} (one more than the length: "
          "the last position's next token)",
          file.string(), n, b.text_bytes, o.length, o.length + 1);
      if (o.short_books == ShortBooks::error)
        throw std::runtime_error(what + "; use --short-books skip to skip such books, or a smaller --length");
      out.skipped.push_back(what);
      continue;
    }
    out.books.push_back(std::move(b));
  }
  if (out.books.empty() || (o.max_books > 0 && out.books.size() < wanted))
    throw std::runtime_error(fmt::format("--books {}: {} holds only {} usable book{} ({} skipped as too short)",
                                         o.max_books, o.text_dir, out.books.size(),
                                         out.books.size() == 1 ? "" : "s", out.skipped.size()));
  return out;
}

}  // namespace replayssm::io
