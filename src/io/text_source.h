// Book text for the teacher-forced KL sweep (REPLAYSSM.md section 10): a PG-19 style directory of
// .txt books, stripped of Project Gutenberg boilerplate, tokenised byte by byte or read back as
// token ids that scripts/tokenize_text.py wrote with the model's own Hugging Face tokenizer.
//
// ---- Stripping ("gutenberg-v1"; scripts/tokenize_text.py implements the same steps, and the token
// manifest records the FNV-1a hash of the stripped bytes so that a disagreement is caught) --------
//  1. a leading UTF-8 byte-order mark is removed; every CR LF becomes LF (a lone CR is kept);
//  2. lines are split at LF. "Trimmed" below means without leading spaces/tabs; comparisons are
//     ASCII case-insensitive and a "phrase" is VERB, optionally "THE " or "THIS ", then
//     "PROJECT GUTENBERG" (single spaces between words, any run of spaces/tabs accepted);
//  3. header: the first line whose trimmed form is three or more '*', optional spaces, then the
//     phrase with VERB "START OF" ("*** START OF THE PROJECT GUTENBERG EBOOK ...", "***START OF
//     THIS PROJECT GUTENBERG EBOOK ..."), or which starts with "*END*THE SMALL PRINT" (pre-2000
//     releases). The marker may run over several lines: when the text after the phrase holds no
//     "***", the following non-blank lines up to and including the first one containing "***"
//     (at most 3 lines) belong to it. The body starts after the marker;
//  4. footer: the first line after the body start whose trimmed form is, after an optional run of
//     three or more '*' and spaces, the phrase with VERB "END OF" ("*** END OF THIS PROJECT
//     GUTENBERG EBOOK ...", "End of the Project Gutenberg EBook of ...", "End of Project
//     Gutenberg's ..."). The body ends before it;
//  5. leading and trailing blank lines (only spaces, tabs, CR) are dropped; the body is its lines
//     joined by LF plus a final LF.
// A file with neither marker is taken to be already stripped (PG-19's own form) and kept whole
// (steps 1 and 5 still apply). A footer without a header is an error (where the book starts is
// unknown), and so is a body that is empty after stripping.
#pragma once
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace replayssm::io {

struct StrippedText {
  std::string text;  // the body (LF line endings, final LF), empty only on error
  bool header_found = false, footer_found = false;
  bool had_bom = false, had_crlf = false;
};

// Throws std::runtime_error "NAME: ..." when a footer has no header or the body is empty.
StrippedText strip_gutenberg(std::string_view raw, const std::string& name);

// 64-bit FNV-1a of the bytes (what the token manifest records for the stripped text).
uint64_t fnv1a64(std::string_view bytes);
uint64_t fnv1a64(const int32_t* ids, std::size_t n);  // over the little-endian bytes of the ids
std::string hex64(uint64_t value);                   // 16 lowercase hex digits

// The book files of a directory: regular files ending in ".txt" (case-insensitive), sorted by
// name, except the notes a corpus folder carries (README*, SOURCES*, LICENSE*, case-insensitive);
// symbolic links are followed and directories skipped. Throws std::runtime_error "no text found in
// DIR: ..." (missing directory, not a directory, no book files) with a hint to point --text-dir at
// a folder of PG-19 books, and naming the entry for a .txt that is a broken symbolic link or not a
// regular file (a FIFO, a device), a directory that cannot be listed, and two files whose names
// differ only in the case of ".txt" (they would be the same book name).
std::vector<std::filesystem::path> list_book_files(const std::string& dir);

enum class ShortBooks : uint8_t { error, skip };
ShortBooks parse_short_books(std::string_view text);  // "error" | "skip"

// Largest --length: far beyond any book (4 TiB of KL values per configuration), and N + 1 can
// never overflow.
inline constexpr int64_t kMaxLength = int64_t{1} << 40;
// Largest --byte-offset: byte value (at most 255) + offset must be an int32 token id.
inline constexpr int32_t kMaxByteOffset = std::numeric_limits<int32_t>::max() - 255;

struct TextSourceOptions {
  std::string text_dir;        // required: the .txt books
  std::string tokens_dir;      // empty: byte-level ids; else scripts/tokenize_text.py output
  int32_t byte_offset = 0;     // byte-level only: id = byte value + byte_offset, in [0, kMaxByteOffset]
  int64_t length = 0;          // positions per book, in [0, kMaxLength]: a book needs length + 1
                               // tokens (the last position's next token), else it is "short"
  int max_books = 0;           // books wanted (0: every book); the first ones in name order
  ShortBooks short_books = ShortBooks::error;
};

struct Book {
  std::string name;            // file name without ".txt"
  std::string source;          // file name inside text_dir
  uint64_t text_hash = 0;      // fnv1a64 of the stripped text
  int64_t text_bytes = 0;      // bytes of the stripped text
  bool header_found = false, footer_found = false;
  std::vector<int32_t> tokens; // the whole book
};

struct LoadedBooks {
  std::vector<Book> books;
  std::vector<std::string> skipped;  // one message per skipped short book
  std::string tokenizer;             // "bytes" or the tokenizer named by the manifest
  std::string tokenization;          // one line for logs: "bytes (id = byte + 0)", ...
  std::string manifest_json;         // tokens_dir's manifest.json as read ("" for bytes)
};

// Byte-level ids of a text. Throws std::invalid_argument for an offset outside [0, kMaxByteOffset].
std::vector<int32_t> byte_tokens(std::string_view text, int32_t offset);

// Loads books in name order until max_books are found. Throws std::invalid_argument for options
// out of range, std::runtime_error with a message meant for the command line: missing text, empty
// books, short books under ShortBooks::error (saying how long the book is and what is needed), too
// few usable books, token files that do not match the text (different stripping or edited books),
// malformed manifests (a book listed twice, too) or .npy files.
LoadedBooks load_books(const TextSourceOptions& options);

}  // namespace replayssm::io
