#!/usr/bin/env python3
"""Which kernels of two builds of libreplayssm_cuda.so have the same SASS (session 36's check before H9b's run).

Disassembles both libraries with cuobjdump -sass, keys each function by its demangled name without the parameter
list (so a kernel that gained a parameter is still compared with its old self), drops addresses and encodings, and
prints one line per kernel that differs (instructions before -> after, and how many lines the two listings do not
share) and a summary. A kernel whose SASS is identical can change a timing only through its launch (parameter block,
grid, shared memory), not through its code.

    python3 sass_same.py MAIN.so ARM.so [--cuobjdump PATH] [--only SUBSTRING]

cuobjdump comes with the CUDA toolkit (or, as here, with Triton's wheel: triton/backends/nvidia/bin/). Session 36:
main's library (lib_land) against lib_h9b from pack57: "339 kernels identical of 357 in both; 18 differ; 0 in one
library only": the 16 NVFP4 non-flush instances and the two GDN FP8-b128 tensor-core ones (4 lines not shared: two
independent register zeroings swapped).
"""
import argparse
import collections
import difflib
import re
import shutil
import subprocess
import sys


def disassemble(library, cuobjdump):
    out = subprocess.run([cuobjdump, "-sass", library], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"sass_same.py: {cuobjdump} -sass {library} failed: {out.stderr.strip()}")
    functions, current = {}, None
    for line in out.stdout.splitlines():
        header = re.match(r"\s+Function : (\S+)", line)
        if header:
            current = header.group(1)
            functions[current] = []
            continue
        instruction = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if current is not None and instruction:
            functions[current].append(instruction.group(1))
    if not functions:
        sys.exit(f"sass_same.py: {library}: no SASS functions found (is it a CUDA library built with device code?)")
    return functions


def by_kernel(functions):
    """Demangled name without its parameter list -> instructions (an overloaded name keeps its full signature)."""
    mangled = list(functions)
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout.split("\n")
    keys = collections.Counter()
    names = []
    for name in demangled[: len(mangled)]:
        key = re.sub(r">\(.*\)$", ">", name) if name.endswith(")") else name
        names.append(key)
        keys[key] += 1
    return {(key if keys[key] == 1 else full): functions[m] for m, key, full in zip(mangled, names, demangled)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("main_library")
    parser.add_argument("arm_library")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    parser.add_argument("--only", default="", help="compare only kernels whose name contains this")
    args = parser.parse_args()
    a = by_kernel(disassemble(args.main_library, args.cuobjdump))
    b = by_kernel(disassemble(args.arm_library, args.cuobjdump))
    a = {k: v for k, v in a.items() if args.only in k}
    b = {k: v for k, v in b.items() if args.only in k}
    common = sorted(set(a) & set(b))
    differ = [k for k in common if a[k] != b[k]]
    for k in differ:
        changed = sum(1 for line in difflib.ndiff(a[k], b[k]) if line[:1] in "+-")
        print(f"differs: {len(a[k])} -> {len(b[k])} instructions, {changed} lines not shared: {k}")
    for k in sorted(set(a) - set(b)):
        print(f"only in {args.main_library}: {k}")
    for k in sorted(set(b) - set(a)):
        print(f"only in {args.arm_library}: {k}")
    print(f"{len(common) - len(differ)} kernels identical of {len(common)} in both; {len(differ)} differ; "
          f"{len(set(a) ^ set(b))} in one library only")


if __name__ == "__main__":
    main()
