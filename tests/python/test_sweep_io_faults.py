"""Faults around the files of `replayssm kl-sweep`, through the CLI on a tiny real model
(data/models/mamba2_tiny): a full disk while a cell, the final merge or a --force rerun is written
(a file size limit, which any user can set; and a full tmpfs where mounting is allowed), a finished
result on a read-only filesystem, and hostile --out files.

A full disk used to end in a segfault at exit (HDF5 1.10 crashes on a file whose close failed);
now it is an ordinary error: exit 1, the file and the reason named, no temporary left, an existing
result untouched, and the finished cells kept for the next run.
"""
import os
import random
import resource
import shutil
import signal
import subprocess

import h5py
import pytest

from conftest import ROOT, replayssm_binary

MODEL = ROOT / "data" / "models" / "mamba2_tiny"
POLICIES = "shared:nvfp4+sr@16,shared:fp16+sr@16"
LENGTH = "1000"


@pytest.fixture(scope="module")
def exe():
    path = replayssm_binary()
    if not os.path.exists(path):
        pytest.skip(f"{path} not built")
    return path


@pytest.fixture()
def text(tmp_path):
    rng = random.Random(17)
    d = tmp_path / "text"
    d.mkdir()
    for name in ("a", "b"):
        (d / f"{name}.txt").write_text("".join(rng.choice("abcdefghij klmnop\n") for _ in range(3000)))
    return d


def sweep_args(exe, text, out, *extra, policies=POLICIES):
    return [exe, "kl-sweep", str(MODEL), "--text-dir", str(text), "--length", LENGTH, "--policies", policies,
            "--out", str(out), "--progress", "off", *extra]


def run_sweep(exe, text, out, *extra, file_size_limit=None, policies=POLICIES):
    def limit():
        # What io::install_temp_cleanup_handlers does: a write past the limit fails with EFBIG
        # instead of killing the process with SIGXFSZ.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))

    return subprocess.run(sweep_args(exe, text, out, *extra, policies=policies), capture_output=True, text=True,
                          timeout=300, preexec_fn=limit if file_size_limit else None)


def temporaries(folder):
    return sorted(str(p) for p in folder.rglob("*") if ".tmp-" in p.name)


def test_disk_full_while_a_cell_is_written(exe, text, tmp_path):
    out = tmp_path / "res" / "r.h5"
    r = run_sweep(exe, text, out, file_size_limit=4000)  # below one cell file (about 38 KB)
    assert r.returncode == 2, r.stderr  # was -11: a segfault in HDF5's exit handler
    cell = out.parent / ".r.h5.parts" / "c0000-b00000.h5"
    assert f"cannot write {cell}" in r.stderr and "File too large" in r.stderr, r.stderr
    assert temporaries(out.parent) == []
    assert not out.exists()
    again = run_sweep(exe, text, out)
    assert again.returncode == 0, again.stderr
    assert "4 computed now" in again.stdout


def test_disk_full_during_the_final_merge_keeps_the_cells(exe, text, tmp_path):
    out = tmp_path / "r.h5"
    r = run_sweep(exe, text, out, file_size_limit=80000)  # cells (about 38 KB) fit, the result (166 KB) not
    assert r.returncode == 2, r.stderr
    assert f"cannot write {out}: " in r.stderr and "(the file size limit was reached)" in r.stderr, r.stderr
    assert temporaries(tmp_path) == []
    assert not out.exists()
    assert len(list((tmp_path / ".r.h5.parts").glob("c*.h5"))) == 4
    again = run_sweep(exe, text, out)
    assert again.returncode == 0, again.stderr
    assert "0 computed now, 4 from an earlier run" in again.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.h5", "text"]


def test_disk_full_during_a_forced_rerun_leaves_the_old_result(exe, text, tmp_path):
    out = tmp_path / "r.h5"
    first = run_sweep(exe, text, out, policies="shared:nvfp4+sr@16")
    assert first.returncode == 0, first.stderr
    before = out.read_bytes()
    r = run_sweep(exe, text, out, "--force", file_size_limit=len(before) + 100)
    assert r.returncode == 2, r.stderr
    assert f"cannot write {out}" in r.stderr, r.stderr
    assert out.read_bytes() == before
    assert temporaries(tmp_path) == []
    with h5py.File(out, "r") as f:
        assert list(f["config_order"].asstr()[:]) == ["shared:nvfp4+sr@16"]


def in_private_mount_namespace(script):
    """Runs `script` with sh in a private mount namespace (mounts vanish with it); skips with the
    reason where this machine does not allow it."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed: cannot mount a private filesystem here")
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        pytest.skip(f"mounting in a private namespace is not allowed here (needs CAP_SYS_ADMIN): {probe.stderr.strip()}")
    return subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, timeout=300)


def test_a_full_filesystem_is_reported_as_such(exe, text, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    cmd = " ".join(f"'{a}'" for a in sweep_args(exe, text, full / "r.h5"))
    r = in_private_mount_namespace(
        f"mount -t tmpfs -o size=250k tmpfs '{full}' && {{ {cmd}; echo rc=$?; find '{full}' | sort; }}")
    assert "rc=2" in r.stdout, r.stdout + r.stderr
    assert f"cannot write {full / 'r.h5'}" in r.stderr and "No space left on device (the disk is full)" in r.stderr
    assert ".tmp-" not in r.stdout  # no temporary on the full filesystem
    assert "c0001-b00001.h5" in r.stdout  # the cells survive for the next run


def test_a_finished_result_is_summarised_on_a_read_only_filesystem(exe, text, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    out = results / "r.h5"
    first = run_sweep(exe, text, out)
    assert first.returncode == 0, first.stderr
    before = out.read_bytes()
    cmd = " ".join(f"'{a}'" for a in sweep_args(exe, text, out))
    r = in_private_mount_namespace(f"mount --bind '{results}' '{results}' && mount -o remount,bind,ro '{results}' && "
                                   f"{{ touch '{results}/probe' 2>/dev/null && echo writable; {cmd}; echo rc=$?; }}")
    assert "writable" not in r.stdout
    assert "rc=0" in r.stdout, r.stdout + r.stderr  # was: "cannot create lock file ... Read-only file system"
    assert "already complete" in r.stderr
    assert "shared:fp16+sr@16" in r.stdout and "mean KL" in r.stdout
    assert r.stdout.split("results:")[0] == first.stdout.split("results:")[0]  # the same table
    assert out.read_bytes() == before
    assert sorted(p.name for p in results.iterdir()) == ["r.h5"]


def test_hostile_outputs_are_refused_and_left_alone(exe, text, tmp_path):
    (tmp_path / "dir.h5").mkdir()
    r = run_sweep(exe, text, tmp_path / "dir.h5")
    assert r.returncode == 2 and f"--out {tmp_path / 'dir.h5'} is a directory" in r.stderr, r.stderr

    notes = tmp_path / "notes.h5"
    notes.write_text("my notes")
    r = run_sweep(exe, text, notes)
    assert r.returncode == 2 and f"{notes}: not an HDF5 file" in r.stderr and "--force" in r.stderr, r.stderr
    assert notes.read_text() == "my notes"

    good = tmp_path / "good.h5"
    assert run_sweep(exe, text, good).returncode == 0
    # Edited by another tool: an aggregate of the wrong size, a newer schema version.
    bad = tmp_path / "bad.h5"
    shutil.copy(good, bad)
    with h5py.File(bad, "r+") as f:
        g = f["configs/shared:nvfp4+sr@16/aggregate"]
        del g["bucket_count"]
        g["bucket_count"] = [1, 2]
    r = run_sweep(exe, text, bad)
    assert r.returncode == 2, r.stderr
    assert "configs/shared:nvfp4+sr@16/aggregate/bucket_count holds 2 values, expected" in r.stderr, r.stderr
    newer = tmp_path / "newer.h5"
    shutil.copy(good, newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["schema_version"] = 3
    r = run_sweep(exe, text, newer)
    assert r.returncode == 2 and "result schema version 3 (this build reads 1 to 2)" in r.stderr, r.stderr
    # A file that does not say it is complete is not taken for a finished result.
    unfinished = tmp_path / "unfinished.h5"
    shutil.copy(good, unfinished)
    with h5py.File(unfinished, "r+") as f:
        del f["configs/shared:fp16+sr@16"].attrs["complete"]
    r = run_sweep(exe, text, unfinished)
    assert r.returncode == 2 and f"{unfinished} holds this sweep but is not marked complete" in r.stderr, r.stderr
    # A float where a count belongs is refused, not truncated.
    floaty = tmp_path / "floaty.h5"
    shutil.copy(good, floaty)
    with h5py.File(floaty, "r+") as f:
        g = f["configs/shared:fp16+sr@16/aggregate"]
        value = float(g["positions"][()])
        del g["positions"]
        g["positions"] = value + 0.5
    r = run_sweep(exe, text, floaty)
    assert r.returncode == 2 and "aggregate/positions: dataset holds float64, expected int64" in r.stderr, r.stderr
    assert temporaries(tmp_path) == []
