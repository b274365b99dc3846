#!/usr/bin/env python3
"""Plot the memory trace of scripts/train_tiny.py runs: per logged step, the heads' memories from the weights
and measured on text (train_log.json log[].memory / memory_text).

  python3 scripts/plot_memory_trace.py RUN_DIR_OR_TRAIN_LOG [...] [--out FILE.png]

The plot: python/replayssm_py/memory_trace_plot.py.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.memory_trace_plot import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
