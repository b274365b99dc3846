import os
import pathlib
import random
import sys

import pytest

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


TEXT_SEED = 20261130
TEXT_WORDS = "the of and to a in that is was he for it with as his on be at by night day came dark".split()


@pytest.fixture
def text_dir(tmp_path):
    """Two books of about 3 KB of words (fixed seed), for short kl-sweeps."""
    d = tmp_path / "books"
    d.mkdir()
    rng = random.Random(TEXT_SEED)
    for name in ("a", "b"):
        (d / f"{name}.txt").write_text(" ".join(rng.choice(TEXT_WORDS) for _ in range(700)) + "\n")
    return d
