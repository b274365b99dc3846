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
