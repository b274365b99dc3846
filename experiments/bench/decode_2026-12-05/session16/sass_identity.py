"""Per-function SASS hashes of a CUDA library, for "SASS-identical" claims between two builds.

    cuobjdump -sass A.so | python3 sass_identity.py > a.hash
    cuobjdump -sass B.so | python3 sass_identity.py > b.hash
    join a.hash b.hash | awk '$2 != $3'      # functions whose code differs
    join -v1 a.hash b.hash                   # functions only in A

Normalised away, so that two builds of the same code compare equal: the anonymous-namespace part of a
kernel's mangled name (it carries the source file's name, path and a hash), its length prefix, the
instruction addresses and encodings, blank lines and the module headers that cuobjdump prints between
functions (`identifier = <path>`, `compressed`, `code for sm_90`, ...).
"""
import hashlib
import re
import sys

ANON = re.compile(r"\d*_GLOBAL__N__[0-9a-f]+_\d+_[A-Za-z0-9_]+?_[0-9a-f]{8}")
INTERNAL = re.compile(r"_INTERNAL_[0-9a-f]+_\d+_[A-Za-z0-9_]+?_[0-9a-f]{8}")
HEADER = re.compile(r"^\s*(Fatbin|=+|arch =|code version|host =|compile_size|identifier =|compressed|code for|\.)")


def normalise(text):
    return INTERNAL.sub("_I_", ANON.sub("_G_", text))


def main():
    hashes, name, digest = {}, None, None
    for line in sys.stdin:
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                hashes[name] = digest.hexdigest()
            name, digest = normalise(m.group(1)), hashlib.sha1()
            continue
        if name is None or not line.strip() or HEADER.match(line):
            continue
        code = re.sub(r"/\*[0-9a-f]{4,}\*/", "", line)  # the address
        code = re.sub(r"/\* 0x[0-9a-f]{16} \*/", "", code)  # the encoding
        digest.update(normalise(code).strip().encode())
    if name:
        hashes[name] = digest.hexdigest()
    for key in sorted(hashes):
        print(key, hashes[key])


if __name__ == "__main__":
    main()
