"""`replayssm logits` outputs under interruption (SIGINT, SIGKILL), a file-size limit and an existing
result (issue 17, defect 11): no temporary is left, the exit says why, an existing output is intact."""
import os
import pathlib
import resource
import signal
import subprocess
import time

import numpy as np

from conftest import replayssm_binary

MODEL = pathlib.Path(__file__).resolve().parents[2] / "data" / "models" / "tiny_mamba2"
SEED = 20261201


def tokens(tmp_path, n):
    ids = np.random.default_rng(SEED).integers(0, 256, n).astype(np.int64)
    np.save(tmp_path / "ids.npy", ids)
    return str(tmp_path / "ids.npy")


def logits_cmd(tmp_path, ids, *extra):
    return [replayssm_binary(), "logits", str(MODEL), "--tokens", ids, "--out", str(tmp_path / "lp.npy"),
            "--threads", "1", *extra]


def temporaries(d):
    return sorted(p.name for p in d.iterdir() if ".tmp" in p.name)


def start_and_wait_for_temporary(tmp_path, cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not temporaries(tmp_path):
        assert p.poll() is None, p.communicate()
        time.sleep(0.01)
    assert temporaries(tmp_path) == [f".lp.npy.tmp-{p.pid}"]
    return p


def test_existing_output_needs_force(tmp_path):
    ids = tokens(tmp_path, 20)
    (tmp_path / "lp.npy").write_bytes(b"previous result")
    r = subprocess.run(logits_cmd(tmp_path, ids), capture_output=True, text=True)
    assert r.returncode == 2 and "--out" in r.stderr and "lp.npy" in r.stderr and "use --force" in r.stderr
    assert (tmp_path / "lp.npy").read_bytes() == b"previous result"
    r = subprocess.run(logits_cmd(tmp_path, ids, "--force"), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "lp.npy").shape == (20, 256)


def test_bad_output_paths(tmp_path):
    ids = tokens(tmp_path, 5)
    for out, words in [(tmp_path, "is a directory"), (tmp_path / "no" / "lp.npy", "does not exist"),
                       (pathlib.Path(ids), "is the input")]:
        r = subprocess.run([replayssm_binary(), "logits", str(MODEL), "--tokens", ids, "--out", str(out), "--force"],
                           capture_output=True, text=True)
        assert r.returncode == 2 and "--out" in r.stderr and words in r.stderr, r.stderr
    assert np.load(ids).shape == (5,)


def test_sigint_removes_the_temporary_and_keeps_the_old_output(tmp_path):
    ids = tokens(tmp_path, 8000)
    (tmp_path / "lp.npy").write_bytes(b"previous result")
    p = start_and_wait_for_temporary(tmp_path, logits_cmd(tmp_path, ids, "--force"))
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT
    assert "stopped by SIGINT" in err and f"removed the unfinished output {tmp_path}/.lp.npy.tmp-{p.pid}" in err
    assert temporaries(tmp_path) == []
    assert (tmp_path / "lp.npy").read_bytes() == b"previous result"


def test_sigkill_temporary_is_removed_by_the_next_run(tmp_path):
    ids = tokens(tmp_path, 8000)
    p = start_and_wait_for_temporary(tmp_path, logits_cmd(tmp_path, ids))
    p.kill()
    p.communicate(timeout=60)
    stale = f".lp.npy.tmp-{p.pid}"
    assert temporaries(tmp_path) == [stale] and not (tmp_path / "lp.npy").exists()
    tokens(tmp_path, 10)
    r = subprocess.run(logits_cmd(tmp_path, ids), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"removed {tmp_path}/{stale} (left by an interrupted run)" in r.stderr
    assert temporaries(tmp_path) == [] and np.load(tmp_path / "lp.npy").shape == (10, 256)


def test_file_size_limit_is_an_error_not_a_signal(tmp_path):
    ids = tokens(tmp_path, 200)  # 200 x 256 floats = 200 KiB > the limit
    (tmp_path / "lp.npy").write_bytes(b"previous result")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))

    r = subprocess.run(logits_cmd(tmp_path, ids, "--force"), capture_output=True, text=True, preexec_fn=limit)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "lp.npy" in r.stderr and "file size limit" in r.stderr
    assert temporaries(tmp_path) == [] and (tmp_path / "lp.npy").read_bytes() == b"previous result"
    assert os.path.getsize(tmp_path / "lp.npy") == len(b"previous result")
