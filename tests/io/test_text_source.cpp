#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/npy.h"
#include "io/text_source.h"
#include "test_util.h"

using namespace replayssm::io;
namespace fs = std::filesystem;

using replayssm::test::error_of;
using replayssm::test::contains;

namespace {

fs::path fresh_dir(const std::string& name) { return replayssm::test::fresh_dir("text_" + name); }

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

std::string crlf(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\n') o += '\r';
    o += c;
  }
  return o;
}

const std::string kBody = "CHAPTER I\n\nIt was a dark night.\n  Indented line.\nThe end of the day came.\n";

// The variants of the Project Gutenberg releases in shared/data (restated, not copied).
const std::vector<std::pair<std::string, std::string>> kVariants = {
    {"this-ebook", "The Project Gutenberg EBook of X, by Y\n\nTitle: X\n\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\n\n" +
                       kBody + "\n\n\nEnd of the Project Gutenberg EBook of X, by Y\n\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\n\nlicence\n"},
    {"the-ebook-nospace", "Title: X\n\n***START OF THE PROJECT GUTENBERG EBOOK X***\n\n" + kBody +
                              "\n***END OF THE PROJECT GUTENBERG EBOOK X***\n\n*** START: FULL LICENSE ***\nstuff\n"},
    {"two-line-marker", "Title: X\n\n***START OF THE PROJECT GUTENBERG EBOOK REMINISCENCES OF PIONEER DAYS IN\nST. PAUL***\n\n\n" +
                            kBody + "\n\n***END OF THE PROJECT GUTENBERG EBOOK REMINISCENCES OF PIONEER DAYS IN ST.\nPAUL***\n"},
    {"end-of-projects", "*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n" + kBody +
                            "End of Project Gutenberg's X, by Y\n\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\n"},
    {"old-small-print", "header\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n" + kBody +
                            "\nEnd of this Project Gutenberg Etext of X\n"},
    {"lowercase-indented", "   ***   start of the project gutenberg ebook x ***\n" + kBody + "  *** end of the project gutenberg ebook x\n"},
};

}  // namespace

TEST_CASE("Gutenberg header and footer variants are stripped to the same body") {
  for (const auto& [name, text] : kVariants) {
    CAPTURE(name);
    const StrippedText s = strip_gutenberg(text, name);
    CHECK(s.text == kBody);
    CHECK(s.header_found);
    CHECK(s.footer_found);
    const StrippedText c = strip_gutenberg("\xEF\xBB\xBF" + crlf(text), name);  // BOM + CRLF
    CHECK(c.text == kBody);
    CHECK(c.had_bom);
    CHECK(c.had_crlf);
  }
}

TEST_CASE("texts without markers are kept whole; what cannot be stripped is an error") {
  const StrippedText pg19 = strip_gutenberg("\n\nProduced by the Online Distributed Proofreading Team\n\n" + kBody + "\n\n",
                                            "pg19");
  CHECK_FALSE(pg19.header_found);
  CHECK_FALSE(pg19.footer_found);
  CHECK(pg19.text == "Produced by the Online Distributed Proofreading Team\n\n" + kBody);
  // A lone CR is text, not a line ending; no final newline is added twice.
  CHECK(strip_gutenberg("a\rb", "cr").text == "a\rb\n");
  // A marker line that never closes takes only itself; a start marker without a footer keeps the rest.
  CHECK(strip_gutenberg("*** START OF THE PROJECT GUTENBERG EBOOK X\n\nBody\n", "open").text == "Body\n");
  // Phrases must be whole: "STARTS", "PROJECT GUTENBERGS" are not markers... but body lines mentioning
  // the end of a project are not footers.
  CHECK(strip_gutenberg("*** START OF THE PROJECT GUTENBERG EBOOK X ***\nthe end of the project was near\n", "x").text ==
        "the end of the project was near\n");
  CHECK_THROWS_WITH(strip_gutenberg(kBody + "*** END OF THE PROJECT GUTENBERG EBOOK X ***\n", "nohead.txt"),
                    doctest::Contains("nohead.txt: has a Project Gutenberg footer"));
  CHECK_THROWS_WITH(strip_gutenberg("*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n  \n*** END OF THE PROJECT "
                                    "GUTENBERG EBOOK X ***\n",
                                    "empty.txt"),
                    doctest::Contains("empty.txt: empty after removing"));
  CHECK_THROWS_WITH(strip_gutenberg("", "zero.txt"), doctest::Contains("empty"));
}

TEST_CASE("FNV-1a 64 known answers") {
  CHECK(hex64(fnv1a64(std::string_view(""))) == "cbf29ce484222325");
  CHECK(hex64(fnv1a64(std::string_view("a"))) == "af63dc4c8601ec8c");
  CHECK(hex64(fnv1a64(std::string_view("foobar"))) == "85944171f73967e8");
  const int32_t ids[2] = {0x61, 0};
  CHECK(fnv1a64(ids, 1) == fnv1a64(std::string_view("a\0\0\0", 4)));
}

TEST_CASE("a book directory: sorted .txt files, corpus notes left out, clear errors") {
  const fs::path d = fresh_dir("dir");
  const std::string missing = error_of([&] { list_book_files((d / "missing").string()); });
  CHECK(contains(missing, "no text found in"));
  CHECK(contains(missing, "does not exist"));
  CHECK(contains(missing, "point --text-dir at a folder of PG-19 .txt books, e.g. ../shared/data/pg19/test"));
  CHECK_THROWS_WITH(list_book_files(d.string()), doctest::Contains("no .txt books"));
  write(d / "b.txt", "*** START OF THE PROJECT GUTENBERG EBOOK B ***\nbbbb\n");
  write(d / "a.TXT", "aaaaaaaaaa\n");
  write(d / "SOURCES.txt", "notes\n");
  write(d / "readme.txt", "notes\n");
  write(d / "c.md", "no\n");
  fs::create_directories(d / "dir.txt");
  const auto files = list_book_files(d.string());
  REQUIRE(files.size() == 2);
  CHECK(files[0].filename() == "a.TXT");
  CHECK(files[1].filename() == "b.txt");

  TextSourceOptions o;
  o.text_dir = d.string();
  o.length = 4;
  o.byte_offset = 3;
  const LoadedBooks lb = load_books(o);
  REQUIRE(lb.books.size() == 2);
  CHECK(lb.books[0].name == "a");
  CHECK(lb.books[1].name == "b");
  CHECK(lb.books[1].tokens == std::vector<int32_t>{'b' + 3, 'b' + 3, 'b' + 3, 'b' + 3, '\n' + 3});
  CHECK(lb.books[1].header_found);
  CHECK(lb.tokenizer == "bytes");
  CHECK(lb.tokenization.find("+ 3") != std::string::npos);

  // Short books: an error saying how long the book is, or skipped.
  o.length = 5;
  const std::string short_msg = error_of([&] { load_books(o); });
  CHECK(contains(short_msg, "b.txt: 5 tokens after stripping"));
  CHECK(contains(short_msg, "--length 5 needs 6"));
  CHECK(contains(short_msg, "--short-books skip"));
  o.short_books = ShortBooks::skip;
  const LoadedBooks skipped = load_books(o);
  REQUIRE(skipped.books.size() == 1);
  CHECK(skipped.books[0].name == "a");
  CHECK(skipped.skipped.size() == 1);
  o.max_books = 2;
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("holds only 1 usable book (1 skipped"));
  o.max_books = 1;
  o.length = 4;
  o.short_books = ShortBooks::error;
  CHECK(load_books(o).books.size() == 1);
  CHECK(parse_short_books("skip") == ShortBooks::skip);
  CHECK_THROWS(parse_short_books("maybe"));

  write(d / "c.txt", "*** START OF THE PROJECT GUTENBERG EBOOK C ***\n\n*** END OF THE PROJECT GUTENBERG EBOOK C ***\n");
  o.max_books = 0;
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("c.txt: empty after removing"));
  fs::remove_all(d);
}

TEST_CASE("a .txt entry that cannot be read as a book is named, not skipped") {
  const fs::path d = fresh_dir("entries");
  write(d / "a.txt", "aaaaaaaa\n");
  // A broken link used to be skipped, and a folder of only broken links said "no .txt books".
  fs::create_symlink(d / "gone.txt", d / "b.txt");
  const std::string broken = error_of([&] { list_book_files(d.string()); });
  CHECK(contains(broken, (d / "b.txt").string() + ": a broken symbolic link"));
  CHECK(contains(broken, "gone.txt"));
  fs::remove(d / "b.txt");
  // A link to a book is the book.
  fs::create_symlink(d / "a.txt", d / "c.txt");
  CHECK(list_book_files(d.string()).size() == 2);
  fs::remove(d / "c.txt");
  // A FIFO would block the reader; it is refused, named.
  REQUIRE(::mkfifo((d / "pipe.txt").c_str(), 0600) == 0);
  CHECK_THROWS_WITH(list_book_files(d.string()), doctest::Contains("pipe.txt: a FIFO, not a book file"));
  fs::remove(d / "pipe.txt");
  // A loop of links.
  fs::create_symlink(d / "y.txt", d / "x.txt");
  fs::create_symlink(d / "x.txt", d / "y.txt");
  CHECK_THROWS_WITH(list_book_files(d.string()), doctest::Contains("x.txt: cannot be read as a book"));
  fs::remove(d / "x.txt");
  fs::remove(d / "y.txt");
  // Two files that are the same book name.
  write(d / "a.TXT", "bbbbbbbb\n");
  const std::string twice = error_of([&] { list_book_files(d.string()); });
  CHECK(contains(twice, "a.TXT and a.txt are both book 'a'"));
  fs::remove(d / "a.TXT");
  // A text dir that is a file.
  CHECK_THROWS_WITH(list_book_files((d / "a.txt").string()), doctest::Contains("a.txt: not a directory"));
  fs::remove_all(d);
}

TEST_CASE("--length and --byte-offset ranges: no overflow of N + 1 or byte + offset") {
  const fs::path d = fresh_dir("ranges");
  write(d / "a.txt", "abcdefgh\n");  // 9 bytes
  TextSourceOptions o;
  o.text_dir = d.string();
  // INT64_MAX + 1 overflowed in the short-book test and the book passed as long enough.
  o.length = std::numeric_limits<int64_t>::max();
  CHECK_THROWS_AS(load_books(o), std::invalid_argument);
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("--length 9223372036854775807 is outside [0, 1099511627776]"));
  o.length = -1;
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("--length -1 is outside"));
  // The largest length is a short book like any other, with N + 1 said right.
  o.length = kMaxLength;
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("--length 1099511627776 needs 1099511627777"));
  // A 9-token book has 8 positions and no more.
  o.length = 8;
  CHECK(load_books(o).books.at(0).tokens.size() == 9);
  o.length = 9;
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("9 tokens after stripping"));

  // byte + offset must be an int32 id: 255 + offset <= INT32_MAX.
  o.length = 8;
  o.byte_offset = kMaxByteOffset;
  const LoadedBooks top = load_books(o);
  CHECK(top.books.at(0).tokens.at(0) == 'a' + kMaxByteOffset);
  CHECK(byte_tokens("\xff", kMaxByteOffset).at(0) == std::numeric_limits<int32_t>::max());
  o.byte_offset = kMaxByteOffset + 1;
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("--byte-offset 2147483393 is outside [0, 2147483392]"));
  CHECK_THROWS_AS(byte_tokens("a", std::numeric_limits<int32_t>::max()), std::invalid_argument);
  CHECK_THROWS_AS(byte_tokens("a", -1), std::invalid_argument);
  fs::remove_all(d);
}

TEST_CASE("pre-tokenised books: manifest, .npy ids, and refusal of tokens made from other text") {
  const fs::path d = fresh_dir("tokens");
  fs::create_directories(d / "text");
  fs::create_directories(d / "tok");
  write(d / "text" / "10001.txt", "*** START OF THIS PROJECT GUTENBERG EBOOK A ***\r\nHello world.\r\n");
  const std::string body = "Hello world.\n";
  const std::vector<int64_t> ids = {5, 17, 9, 2, 40};
  write_npy((d / "tok" / "10001.npy").string(), "<i8", {ids.size()}, ids.data(), ids.size() * 8);
  nlohmann::json m = {{"format", "replayssm-tokens"}, {"version", 1}, {"strip", "gutenberg-v1"},
                      {"tokenizer", "my/tokenizer"},
                      {"books", {{{"name", "10001"}, {"source", "10001.txt"}, {"tokens", "10001.npy"}, {"n_tokens", 5},
                                  {"text_fnv1a64", hex64(fnv1a64(body))}}}}};
  write(d / "tok" / "manifest.json", m.dump());
  TextSourceOptions o;
  o.text_dir = (d / "text").string();
  o.tokens_dir = (d / "tok").string();
  o.length = 4;
  const LoadedBooks lb = load_books(o);
  REQUIRE(lb.books.size() == 1);
  CHECK(lb.books[0].tokens == std::vector<int32_t>{5, 17, 9, 2, 40});
  CHECK(lb.tokenizer == "my/tokenizer");
  CHECK(lb.books[0].text_hash == fnv1a64(body));

  // The text changed since tokenisation.
  write(d / "text" / "10001.txt", "*** START OF THIS PROJECT GUTENBERG EBOOK A ***\r\nHello world!\r\n");
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("were made from different text"));
  // A book missing from the manifest, a bad manifest, bad ids.
  write(d / "text" / "10001.txt", "*** START OF THIS PROJECT GUTENBERG EBOOK A ***\r\nHello world.\r\n");
  write(d / "text" / "10002.txt", "more\n");
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("10002.txt is not in the token manifest"));
  o.max_books = 1;
  CHECK(load_books(o).books.size() == 1);
  m["version"] = 7;
  write(d / "tok" / "manifest.json", m.dump());
  const std::string bad_manifest = error_of([&] { load_books(o); });
  CHECK(contains(bad_manifest, "malformed token manifest"));
  CHECK(contains(bad_manifest, "version 7"));
  m["version"] = 1;
  write(d / "tok" / "manifest.json", m.dump());
  const float f[5] = {1, 2, 3, 4, 5};
  write_npy_float32((d / "tok" / "10001.npy").string(), {5}, f);
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("token ids must be int32"));
  const std::vector<int64_t> neg = {1, -2, 3, 4, 5};
  write_npy((d / "tok" / "10001.npy").string(), "<i8", {5}, neg.data(), 40);
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("outside [0, 2^31)"));
  // A book listed twice in the manifest (the second entry used to win silently), books not an array.
  nlohmann::json twice = m;
  twice["books"].push_back(twice["books"][0]);
  twice["books"][1]["tokens"] = "other.npy";
  write(d / "tok" / "manifest.json", twice.dump());
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("book \"10001.txt\" is listed twice"));
  for (const char* outside : {"../10001.npy", "/etc/passwd", "sub/10001.npy", ""}) {
    nlohmann::json escape = m;
    escape["books"][0]["tokens"] = outside;
    write(d / "tok" / "manifest.json", escape.dump());
    CHECK(contains(error_of([&] { load_books(o); }), fmt::format("\"tokens\": \"{}\" is not a file name inside", outside)));
  }
  nlohmann::json object = m;
  object["books"] = {{"x", m["books"][0]}};
  write(d / "tok" / "manifest.json", object.dump());
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("field \"books\" is not an array"));
  o.tokens_dir = (d / "text").string();
  CHECK_THROWS_WITH(load_books(o), doctest::Contains("no manifest.json"));
  fs::remove_all(d);
}

TEST_CASE("the shared PG-19 books: every variant found, licence text gone") {
  for (const char* rel : {"../shared/data/pg19/test", "../shared/data/gutenberg-train"}) {
    const std::string dir = replayssm::test::source_path(rel);
    if (!fs::exists(dir)) {
      MESSAGE("no " << dir << ": shared data not present, case skipped");
      continue;
    }
    CAPTURE(dir);
    TextSourceOptions o;
    o.text_dir = dir;
    const LoadedBooks lb = load_books(o);
    CHECK(lb.books.size() >= 4);
    for (const auto& b : lb.books) {
      CAPTURE(b.source);
      CHECK(b.header_found);
      CHECK(b.footer_found);
      const std::string text(b.tokens.begin(), b.tokens.end());
      CHECK(text.find('\r') == std::string::npos);
      CHECK(text.find("\xEF\xBB\xBF") == std::string::npos);
      CHECK(text.find("PROJECT GUTENBERG EBOOK") == std::string::npos);
      CHECK(text.find("FULL LICENSE") == std::string::npos);
      CHECK(text.find("End of Project Gutenberg") == std::string::npos);
      CHECK(text.find("End of the Project Gutenberg") == std::string::npos);
      CHECK(b.tokens.size() > 100000);  // whole books, not a fragment
    }
  }
}

TEST_CASE("scripts/tokenize_text.py strips exactly like the C++ reader (byte tokenizer, shared and synthetic books)") {
  if (std::system("python3 -c 'import numpy' >/dev/null 2>&1") != 0) {
    MESSAGE("python3 with numpy not available: case skipped");
    return;
  }
  const fs::path d = fresh_dir("python");
  fs::create_directories(d / "synthetic");
  int i = 0;
  for (const auto& [name, text] : kVariants) {
    write(d / "synthetic" / (std::to_string(10000 + i) + ".txt"), i % 2 ? "\xEF\xBB\xBF" + crlf(text) : text);
    ++i;
  }
  std::vector<std::string> dirs = {(d / "synthetic").string()};
  for (const char* rel : {"../shared/data/pg19/test", "../shared/data/gutenberg-train"})
    if (fs::exists(replayssm::test::source_path(rel))) dirs.push_back(replayssm::test::source_path(rel));
  for (std::size_t k = 0; k < dirs.size(); ++k) {
    CAPTURE(dirs[k]);
    const fs::path out = d / ("tok" + std::to_string(k));
    const std::string cmd = "python3 '" + replayssm::test::source_path("scripts/tokenize_text.py") + "' --text-dir '" +
                            dirs[k] + "' --tokenizer bytes --byte-offset 3 --out '" + out.string() + "' 2>/dev/null";
    REQUIRE(std::system(cmd.c_str()) == 0);
    TextSourceOptions py, cpp;
    py.text_dir = cpp.text_dir = dirs[k];
    py.tokens_dir = out.string();
    cpp.byte_offset = 3;
    const LoadedBooks a = load_books(py);  // checks every stripped-text hash against the manifest
    const LoadedBooks b = load_books(cpp);
    REQUIRE(a.books.size() == b.books.size());
    for (std::size_t j = 0; j < a.books.size(); ++j) CHECK(a.books[j].tokens == b.books[j].tokens);
  }
  fs::remove_all(d);
}
