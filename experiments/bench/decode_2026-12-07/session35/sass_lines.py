"""Executed warp instructions a warp by source line: Nsight Compute's per-instruction SASS counts (the `_sass.csv.xz`
that session33/ncu_read.sh writes) matched, instruction by instruction, to the same kernel's SASS with line info
(`nvdisasm -g -c` of the object built with -lineinfo, as the CUDA library is). The two must be the same code: the
script stops on the first opcode that differs.
Usage (session 35's figures; the object is main's decode_replay_nonflush.cu.o, cuda/ as at 83a7aa6):
  cuobjdump -xelf all build-dev/cuda/CMakeFiles/replayssm_cuda.dir/ssm/decode_replay_nonflush.cu.o
  nvdisasm -g -c decode_replay_nonflush.sm_90.cubin > nonflush.sass
  python3 sass_lines.py nonflush.sass \\
      experiments/bench/decode_2026-12-07/session34/call4_ncu_h8b/r/qwen3.5-122b-a10b_h8b_sass.csv.xz \\
      --kernel RecurrenceE1ELNS_7formats13StorageFormatE6ELi128ELb0ELb1E --top 40 \\
      --group geometry=decode_common.cuh:195-199 --group smalldiv=decode_common.cuh:209 \\
      --group carve=decode_replay.cuh:190,219-233"""
import argparse
import collections
import csv
import lzma
import re
import sys


def sass_of(path, kernel):
    """[(file, line), instruction] of the one function whose mangled name contains `kernel`."""
    out, name, where, names = [], None, None, set()
    for text in open(path):
        m = re.match(r"^\.text\.(\S+):", text)
        if m:
            name = m.group(1)
            if kernel in name:
                names.add(name)
            continue
        if name is None or kernel not in name:
            continue
        m = re.match(r'\s*//## File "(.*)", line (\d+)', text)
        if m:
            where = (m.group(1).rsplit("/", 1)[-1], int(m.group(2)))
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", text)
        if m:
            out.append((where, m.group(1)))
    if len(names) != 1:
        sys.exit(f"sass_lines.py: {len(names)} functions of {path} match {kernel!r}; name one")
    return out


def opcode(instruction):
    words = instruction.split()
    return words[1] if words[0].startswith("@") else words[0]


def parse_group(spec):
    """NAME=FILE:LINES, LINES a comma-separated list of lines and ranges (190,219-233)."""
    m = re.fullmatch(r"([^=]+)=([^:]+):(\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)", spec)
    if not m:
        sys.exit(f"sass_lines.py: --group {spec!r}: expected NAME=FILE:LINES, e.g. carve=decode_replay.cuh:190,219-233")
    name, file, ranges = m.groups()
    lines = set()
    for part in ranges.split(","):
        lo, _, hi = part.partition("-")
        lines.update(range(int(lo), int(hi or lo) + 1))
    return name, file, lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sass", help="nvdisasm -g -c output")
    ap.add_argument("profile", help="Nsight Compute's source page as CSV (.csv or .csv.xz)")
    ap.add_argument("--kernel", required=True, help="a substring of the kernel's mangled name")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--group", action="append", default=[], help="NAME=FILE:LINES (e.g. carve=decode_replay.cuh:190,219-233)")
    a = ap.parse_args()
    groups = [parse_group(spec) for spec in a.group]
    opener = lzma.open if a.profile.endswith(".xz") else open
    with opener(a.profile, "rt", newline="") as f:
        rows = list(csv.reader(f))
    at = next((i for i, r in enumerate(rows) if "Instructions Executed" in r), None)
    if at is None:
        sys.exit(f"sass_lines.py: {a.profile}: no header row with 'Instructions Executed' (not an ncu source page as CSV)")
    header, rows = rows[at], rows[at + 1:]
    executed = header.index("Instructions Executed")
    source = header.index("Source")
    sass = sass_of(a.sass, a.kernel)
    if len(sass) != len(rows):
        sys.exit(f"sass_lines.py: {len(sass)} instructions in the SASS, {len(rows)} in the profile: not the same code")
    warps = int(rows[0][executed])  # the kernel's first instruction runs once in every warp
    by_line = collections.Counter()
    for i, (row, (where, instruction)) in enumerate(zip(rows, sass)):
        if opcode(row[source].strip()) != opcode(instruction):
            sys.exit(f"sass_lines.py: instruction {i} differs ({row[source].strip()!r} / {instruction!r}): not the same code")
        by_line[where] += int(row[executed]) / warps
    total = sum(by_line.values())
    print(f"{warps} warps, {total:.1f} warp instructions a warp")
    for (file, line), n in by_line.most_common(a.top):
        print(f"{file}:{line:<6d} {n:8.1f} {100 * n / total:5.1f}%")
    for name, file, lines in groups:
        n = sum(v for (f, l), v in by_line.items() if f == file and l in lines)
        print(f"group {name}: {n:.1f} a warp ({100 * n / total:.1f}%)")


if __name__ == "__main__":
    main()
