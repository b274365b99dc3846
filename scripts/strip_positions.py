#!/usr/bin/env python3
"""A kl-sweep result file without its per-position KL (configs/*/kl), for committing long sweeps:

    python3 scripts/strip_positions.py experiments/results/fig13_long_mamba2.h5 \
        experiments/results/fig13_long_mamba2_summary.h5

Every statistic (bucket means, standard errors, percentiles, block sums), attribute and dimension scale is
kept, so scripts/plot_kl.py, the notebook and xarray read the summary as they read the full file; a root
attribute `positions_stripped` says what was left out. The output must not exist (written atomically)."""
import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))  # this checkout's package
from replayssm_py.results import strip_positions  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    a = p.parse_args()
    try:
        out = strip_positions(a.src, a.dst)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        sys.exit(f"strip_positions: {e}")
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, from {pathlib.Path(a.src).stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
