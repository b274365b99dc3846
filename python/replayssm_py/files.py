"""Writing outputs atomically: a reader (or a later run) sees the old file or the whole new one,
never a part, and a failed write leaves no temporary behind."""
import os
import pathlib


def write_atomically(path, write):
    """Calls write(tmp) for a temporary beside path, fsyncs it and renames it over path."""
    path = pathlib.Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomically(path, text):
    return write_atomically(path, lambda tmp: pathlib.Path(tmp).write_text(text, encoding="utf-8"))


def output_refusal(path, force, option):
    """Why `path` cannot be written as a result, or None: checked before any work, as the C++ CLI's
    check_outputs does. Its folder must exist; an existing file is replaced only with force."""
    path = pathlib.Path(path)
    if not path.parent.is_dir():
        return f"{option} {path}: the directory {path.parent} does not exist (create it first)"
    if path.is_dir():
        return f"{option} {path}: is a directory, expected a file name to write"
    if path.exists() and not force:
        return f"{option} {path}: exists; refusing to overwrite a result (use --force to replace it)"
    return None


def write_csv_atomically(path, header, rows):
    """header and rows through Python's csv writer (RFC 4180 quoting), atomically."""
    import csv

    def write(tmp):
        with open(tmp, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    return write_atomically(path, write)
