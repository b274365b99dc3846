import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON_DIR = ROOT / "python"
# The replayssm_py of this checkout, first: an editable install of another checkout must not stand in.
sys.path.insert(0, str(PYTHON_DIR))


def replayssm_binary():
    """The CLI under test: $REPLAYSSM_BIN, else build/replayssm."""
    return os.environ.get("REPLAYSSM_BIN", str(ROOT / "build" / "replayssm"))


def checkout_env(**extra):
    """os.environ for a subprocess (a notebook kernel, a script) that imports this checkout's replayssm_py."""
    path = os.pathsep.join(p for p in (str(PYTHON_DIR), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)
