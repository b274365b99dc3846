"""Result files read as netCDF: the HDF5 dimension scales (/position, /bucket, /book, /percentile, /block)
give xarray named dimensions with their coordinates — `xarray.open_datatree(file, engine="h5netcdf")`,
each configuration group inheriting the root's coordinates — and the values are those h5py reads."""
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import ROOT, replayssm_binary
from replayssm_py.results import load_results

h5py = pytest.importorskip("h5py")
xr = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

MODEL = str(ROOT / "data" / "models" / "mamba2_tiny")


def sweep(tmp_path, text_dir):
    out = tmp_path / "r.h5"
    r = subprocess.run([replayssm_binary(), "kl-sweep", MODEL, "--text-dir", str(text_dir), "--length", "200",
                        "--policies", "shared:nvfp4+sr@4,split:nvfp4/fp32@4", "--progress", "off", "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def test_named_dimensions_and_coordinates(tmp_path, text_dir):
    out = sweep(tmp_path, text_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # h5netcdf's note about phony dimensions of the other datasets
        tree = xr.open_datatree(out, engine="h5netcdf")
    with h5py.File(out, "r") as f:
        books = [b.decode() if isinstance(b, bytes) else b for b in f["books/name"][:]]
        edges = f["bucket_edges"][:]
        for name in f["config_order"][:]:
            name = name.decode() if isinstance(name, bytes) else name
            ds = tree[f"configs/{name}"].to_dataset()
            kl = ds["kl"]
            assert kl.dims == ("book", "position")
            assert list(kl["book"].values) == books
            np.testing.assert_array_equal(kl["position"].values, np.arange(200))
            np.testing.assert_array_equal(kl.values, f["configs"][name]["kl"][:])
            assert ds["bucket_mean"].dims == ("book", "bucket")
            np.testing.assert_array_equal(ds["bucket_mean"]["bucket"].values, edges[1:])  # bucket = its upper length
            assert ds["percentiles"].dims == ("book", "percentile")
            np.testing.assert_array_equal(ds["percentiles"]["percentile"].values, [50, 90, 99, 99.9, 100])
            assert ds["bucket_percentiles"].dims == ("book", "bucket", "percentile")
            assert ds["bucket_mean_se"].dims == ("book", "bucket")
            assert ds["mean_kl"].dims == ("book",)
            assert ds["ppl_ratio"].dims == ("book",)
            # the bootstrap's block sums: one column per block, named by its first position
            assert ds["block_kl_sum"].dims == ("book", "block")
            np.testing.assert_array_equal(ds["block_kl_sum"]["block"].values,
                                          np.arange(0, 200, f.attrs["bootstrap_base_block_length"]))
            agg = tree[f"configs/{name}/aggregate"].to_dataset()
            assert agg["bucket_mean"].dims == ("bucket",)
            np.testing.assert_array_equal(agg["bucket_mean"].values, f["configs"][name]["aggregate/bucket_mean"][:])
            assert agg["bucket_mean_book_se"].dims == ("bucket",)
            assert agg["mean_kl_se"].dims == ()
            # selection by coordinate works: the last bucket's per-book means
            last = ds["bucket_mean"].sel(bucket=edges[-1])
            np.testing.assert_array_equal(last.values, f["configs"][name]["bucket_mean"][:, -1])


@pytest.mark.skipif(shutil.which("h5repack") is None, reason="h5repack (hdf5-tools) not installed")
def test_stripped_file_keeps_every_statistic_and_opens_in_xarray(tmp_path, text_dir):
    """scripts/strip_positions.py leaves out configs/*/kl only: the summary loads to the same statistics, xarray
    opens it with the same named dimensions (no dangling scale reference), and it refuses to overwrite."""
    out = sweep(tmp_path, text_dir)
    small = tmp_path / "r_summary.h5"
    script = str(ROOT / "scripts" / "strip_positions.py")
    r = subprocess.run([sys.executable, script, str(out), str(small)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    full, part = load_results(out), load_results(small)
    assert [c["policy"] for c in part["configs"]] == [c["policy"] for c in full["configs"]]
    for a, b in zip(full["configs"], part["configs"]):
        for key, value in a.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(b[key], value)
            elif key not in ("name",):
                assert b[key] == value or (value != value and b[key] != b[key]), key
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tree = xr.open_datatree(small, engine="h5netcdf")
    with h5py.File(small, "r") as f, h5py.File(out, "r") as g:
        assert "positions_stripped" in f.attrs
        for name in f["config_order"][:]:
            name = name.decode() if isinstance(name, bytes) else name
            assert "kl" not in f["configs"][name] and "kl" in g["configs"][name]
            ds = tree[f"configs/{name}"].to_dataset()
            assert ds["bucket_mean"].dims == ("book", "bucket")
            np.testing.assert_array_equal(ds["bucket_mean"].values, g["configs"][name]["bucket_mean"][:])
            assert ds["block_kl_sum"].dims == ("book", "block")
    before = small.read_bytes()
    r = subprocess.run([sys.executable, script, str(out), str(small)], capture_output=True, text=True)
    assert r.returncode != 0 and "exists" in r.stderr and small.read_bytes() == before
    r = subprocess.run([sys.executable, script, str(small), str(tmp_path / "again.h5")], capture_output=True, text=True)
    assert r.returncode != 0 and "no configs/*/kl" in r.stderr and not (tmp_path / "again.h5").exists()
