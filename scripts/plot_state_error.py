#!/usr/bin/env python3
"""Plot `replayssm state-error` output (appendix C.6 on real states): measured vs predicted
stored-state error per head (docs/STATE_ERROR.md).

  python3 scripts/plot_state_error.py STATE_ERROR.json [--out FILE.png]

The plot: python/replayssm_py/state_error_plot.py.
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.state_error_plot import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
