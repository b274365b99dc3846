"""Project Gutenberg stripping ("gutenberg-v1") and the text hash, step for step as
src/io/text_source.cpp does them, so that token files made here match what `replayssm kl-sweep`
reads (it recomputes the hash of its own stripping and refuses tokens made from other text).

The rule: a UTF-8 BOM is dropped, CRLF becomes LF; everything up to the header marker
("*** START OF THE/THIS PROJECT GUTENBERG EBOOK ...", which may close with "***" on one of the next
three lines, or "*END*THE SMALL PRINT") and from the first footer marker on ("*** END OF ..." or
"End of [the|this] Project Gutenberg ...") is removed; blank lines at both ends go; every kept line
ends in LF. A file with no marker is taken whole.
"""
import pathlib

STRIP_VERSION = "gutenberg-v1"
TEXT_DIR_HINT = "point --text-dir at a folder of PG-19 .txt books, e.g. ../shared/data/pg19/test"
NOT_BOOKS = ("readme", "sources", "license")  # corpus notes that sit beside the books

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK64 = (1 << 64) - 1


class TextError(ValueError):
    """A text folder or book cannot be used; the message names the file and says why."""


def fnv1a64(data: bytes) -> int:
    """64-bit FNV-1a of the bytes (io::fnv1a64 in C++)."""
    h = _FNV_OFFSET
    for c in data:
        h = ((h ^ c) * _FNV_PRIME) & _MASK64
    return h


def hex64(value: int) -> str:
    """16 lower-case hex digits, as the manifest and /books/text_fnv1a64 record a hash."""
    return f"{value:016x}"


# ---- markers ------------------------------------------------------------------------------------

def _ltrim(s):
    return s.lstrip(b" \t")


def _is_blank(s):
    return s.strip(b" \t\r") == b""


def _consume(s, prefix):
    """s without a case-insensitive (ASCII) prefix, or None when s does not start with it."""
    if len(s) >= len(prefix) and s[: len(prefix)].lower() == prefix.lower():
        return s[len(prefix):]
    return None


def _consume_words(s, words):
    """Consumes words separated by runs of spaces/tabs (at least one between two words)."""
    t = s
    for i, w in enumerate(words):
        if i > 0:
            if not t or t[:1] not in (b" ", b"\t"):
                return None
            t = _ltrim(t)
        t = _consume(t, w)
        if t is None:
            return None
    return t


def _phrase(s, verb1, verb2):
    """VERB1 VERB2 [THE|THIS] PROJECT GUTENBERG; the rest of s after it, or None."""
    t = _consume_words(s, [verb1, verb2])
    if t is None:
        return None
    for words in ([b"", b"the", b"project", b"gutenberg"], [b"", b"this", b"project", b"gutenberg"],
                  [b"", b"project", b"gutenberg"]):
        u = _consume_words(t, words)
        if u is not None:
            return u
    return None


def _consume_stars(s):
    n = len(s) - len(s.lstrip(b"*"))
    return _ltrim(s[n:]) if n >= 3 else None


def _header_marker(line):
    """None if the line is no header marker, else whether the marker closes on this line."""
    t = _ltrim(line)
    if _consume(t, b"*END*THE SMALL PRINT") is not None:
        return True
    u = _consume_stars(t)
    if u is None:
        return None
    u = _phrase(u, b"start", b"of")
    if u is None:
        return None
    return b"***" in u


def _footer_marker(line):
    t = _ltrim(line)
    u = _consume_stars(t)
    if u is not None and _phrase(u, b"end", b"of") is not None:
        return True
    return _phrase(t, b"end", b"of") is not None


# ---- stripping ----------------------------------------------------------------------------------

def strip_gutenberg(raw: bytes, name: str = "text"):
    """(body bytes, header_found, footer_found). Raises TextError, with the C++ reader's message,
    when a footer has no header or nothing is left."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    if lines[-1] == b"":  # the LF that ends the last line opens no further line
        lines.pop()
    begin, end = 0, len(lines)
    header = footer = False
    for i, line in enumerate(lines):
        closed = _header_marker(line)
        if closed is None:
            continue
        header = True
        begin = i + 1
        if not closed:  # "*** START OF THE PROJECT GUTENBERG EBOOK A LONG" / "TITLE ***"
            for j in range(i + 1, min(len(lines), i + 4)):
                if _is_blank(lines[j]):
                    break
                if b"***" in lines[j]:
                    begin = j + 1
                    break
        break
    for i in range(begin, len(lines)):
        if _footer_marker(lines[i]):
            footer = True
            end = i
            break
    if footer and not header:
        raise TextError(
            f"{name}: has a Project Gutenberg footer (\"*** END OF ...\" / \"End of the Project Gutenberg ...\") "
            "but no \"*** START OF ...\" header marker, so where the book begins is unknown; strip the header by "
            "hand or remove the file")
    while begin < end and _is_blank(lines[begin]):
        begin += 1
    while end > begin and _is_blank(lines[end - 1]):
        end -= 1
    if begin == end:
        raise TextError(f"{name}: empty after removing the Project Gutenberg header and footer (header marker "
                        f"{'found' if header else 'not found'}, footer marker {'found' if footer else 'not found'})")
    return b"\n".join(lines[begin:end]) + b"\n", header, footer


def strip_book(path):
    """The stripped body of one book file (bytes)."""
    return strip_gutenberg(pathlib.Path(path).read_bytes(), str(path))[0]


def is_book_name(name: str) -> bool:
    """A *.txt file that is not a corpus note (README*, SOURCES*, LICENSE*), case-insensitive."""
    lower = name.lower()
    return len(lower) > 4 and lower.endswith(".txt") and not lower.startswith(NOT_BOOKS)


def list_books(text_dir, hint=TEXT_DIR_HINT):
    """The books of a folder in file-name order, as kl-sweep lists them. A .txt link that leads
    nowhere is an error, not a silently missing book."""
    d = pathlib.Path(text_dir)
    if not d.exists():
        raise TextError(f"no text found in {text_dir}: the directory does not exist; {hint}")
    if not d.is_dir():
        raise TextError(f"no text found in {text_dir}: not a directory; {hint}")
    books = []
    for p in d.iterdir():
        if not is_book_name(p.name):
            continue
        if p.is_symlink() and not p.exists():
            raise TextError(f"{p}: a symbolic link to {p.readlink()}, which does not exist")
        if p.is_file():
            books.append(p)
    if not books:
        raise TextError(f"no text found in {text_dir}: no .txt books in it; {hint}")
    return sorted(books, key=lambda p: p.name.encode("utf-8", "surrogateescape"))
