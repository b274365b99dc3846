"""Reading the CSV tables of `replayssm-bench bench --csv`, as every summary script under experiments/bench
does: plain or .xz, either format.

Until 2026-12-05 the bench wrote its text fields bare, and four kernel labels hold a comma
("nvfp4 read skip=auto, 0% skip (x no skip)", "... 50% ...", "... 100% ...", "fp32 read skip=auto, 100% skip
(x no skip)", "flush skip=auto, pure write (x flush)"): those rows have one field more than the header, and a
plain csv.DictReader shifted their later columns by one (their us_per_step read the window L). Only the kernel
label can hold a comma (model names do not), so such a row is mended by joining the label's pieces. Since then
the bench quotes its text fields (src/io/csv.h) and rows read as they are. Any other field count is an error.
"""
import csv
import lzma


def read_bench_csv(path):
    """The rows of one bench CSV as dicts keyed by its header."""
    path = str(path)
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    header, out = rows[0], []
    for line, fields in enumerate(rows[1:], start=2):
        extra = len(fields) - len(header)
        if extra > 0 and header[1] == "kernel":  # a bare label with `extra` commas
            fields = fields[:1] + [",".join(fields[1:2 + extra])] + fields[2 + extra:]
        if len(fields) != len(header):
            raise ValueError(f"{path}:{line}: {len(fields)} fields where the header has {len(header)}")
        out.append(dict(zip(header, fields)))
    return out
