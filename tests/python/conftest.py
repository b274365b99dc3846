import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))


def replayssm_binary():
    """The CLI under test: $REPLAYSSM_BIN, else build/replayssm."""
    return os.environ.get("REPLAYSSM_BIN", str(ROOT / "build" / "replayssm"))
