"""`mpirun -n R replayssm kl-sweep` (docs/MPI_SWEEP.md) on the bundled byte-level Mamba-2: the
processes share the cells and write the file a single process writes, per-position KL bit for bit;
a rank killed mid-run loses only its own unfinished cell and the rerun completes the same file; a
sweep interrupted with 2 ranks is finished by 3; the output lock still stops a second sweep.
Skipped, saying why, where mpirun is missing or the build has no MPI (REPLAYSSM_MPI=OFF)."""
import os
import pathlib
import shutil
import signal
import subprocess
import time

import h5py
import pytest

from conftest import ROOT, replayssm_binary

MODEL = str(ROOT / "data" / "models" / "tiny_mamba2")
PG19 = ROOT.parent / "shared" / "data" / "pg19" / "test"
N = 2048
POLICIES = "shared:nvfp4+sr,split:nvfp4+rtn/fp16+sr,shared:fp8+rtn"
CELLS = 6  # 3 configurations x 2 books


def mpirun(ranks):
    cmd = ["mpirun", "-n", str(ranks), "--oversubscribe"]
    if os.geteuid() == 0:  # CI containers run as root, which Open MPI refuses unless told
        cmd.append("--allow-run-as-root")
    return cmd


def mpi_env():
    # Shared-memory transfers by plain copies: the kernel's cross-process copy (CMA) needs ptrace
    # rights that containers often withhold.
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")
    # mpirun looks for ssh even to start processes on this machine alone; a container may have none.
    if shutil.which("ssh") is None and shutil.which("rsh") is None:
        env["OMPI_MCA_plm"] = "isolated"
    return env


@pytest.fixture(scope="module")
def books(tmp_path_factory):
    """Two PG-19 test books when ../shared/data has them, else two generated ones of 3 KB."""
    if PG19.is_dir() and len(list(PG19.glob("*.txt"))) >= 2:
        return PG19
    d = tmp_path_factory.mktemp("books")
    import random
    rng = random.Random(15)
    words = "the of and to a in that is was he for it with as his on be at by night day came dark".split()
    for name in ("a", "b"):
        (d / f"{name}.txt").write_text(" ".join(rng.choice(words) for _ in range(900)) + "\n")
    return d


def sweep_args(books, out):
    return ["kl-sweep", MODEL, "--text-dir", str(books), "--books", "2", "--length", str(N), "--policies", POLICIES,
            "--windows", "16", "--out", str(out), "--progress", "lines", "--device", "cpu"]


@pytest.fixture(scope="module")
def mpi_ready(books, tmp_path_factory):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found: the MPI tests need Open MPI (scripts/setup.sh installs openmpi-bin)")
    version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True)
    if "Open MPI" not in version.stdout + version.stderr:
        pytest.skip(f"these tests drive Open MPI's mpirun; found: {version.stdout.strip()[:80]}")
    out = tmp_path_factory.mktemp("probe") / "probe.h5"
    r = subprocess.run([*mpirun(2), replayssm_binary(), *sweep_args(books, out), "--dry-run"], capture_output=True,
                       text=True, env=mpi_env(), timeout=120)
    if "this build has no MPI support" in r.stderr:
        pytest.skip("this replayssm was built without MPI (REPLAYSSM_MPI=OFF or MPI not found at configure time)")
    assert r.returncode == 0, r.stderr
    assert "kl-sweep: 2 processes (Open MPI" in r.stderr, r.stderr
    # Rank 1 is quiet: the run is described once.
    assert r.stderr.count("kl-sweep: reference conv:fp32") == 1, r.stderr
    return True


@pytest.fixture(scope="module")
def single(books, tmp_path_factory):
    """The same sweep run by one plain process: the values every multi-process run must give."""
    out = tmp_path_factory.mktemp("single") / "single.h5"
    r = subprocess.run([replayssm_binary(), *sweep_args(books, out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


def kl_arrays(path):
    with h5py.File(path, "r") as f:
        return {name: f["configs"][name]["kl"][...] for name in f["configs"]}


def assert_same_values(a, b):
    ka, kb = kl_arrays(a), kl_arrays(b)
    assert list(ka) == list(kb)
    for name in ka:
        assert ka[name].shape == (2, N), name
        # bit for bit (NaN included): the bytes, not a tolerance
        assert ka[name].tobytes() == kb[name].tobytes(), name


def parts(out):
    return out.parent / f".{out.name}.parts"


def wait_for_cells(out, proc, count=1, timeout=120):
    """Waits until `count` cell files of `out` exist (the run still going); returns their names."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cells = sorted(p.name for p in parts(out).glob("c*-b*.h5")) if parts(out).is_dir() else []
        if len(cells) >= count:
            return cells
        assert proc.poll() is None, "the sweep ended before its first cell file appeared"
        time.sleep(0.01)
    raise AssertionError("no cell file appeared")


def rank_pids(mpirun_pid):
    """{rank: pid} of the processes mpirun started (its children, by OMPI_COMM_WORLD_RANK)."""
    ranks = {}
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int(next(l for l in (d / "status").read_text().splitlines() if l.startswith("PPid:")).split()[1])
            if ppid != mpirun_pid:
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except (OSError, StopIteration):
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                ranks[int(e.split(b"=")[1])] = int(d.name)
    return ranks


def start(ranks, books, out):
    return subprocess.Popen([*mpirun(ranks), replayssm_binary(), *sweep_args(books, out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=mpi_env())


def run(ranks, books, out):
    return subprocess.run([*mpirun(ranks), replayssm_binary(), *sweep_args(books, out)], capture_output=True,
                          text=True, env=mpi_env(), timeout=300)


def test_two_ranks_write_the_single_process_file(mpi_ready, books, single, tmp_path):
    out = tmp_path / "mpi2.h5"
    r = run(2, books, out)
    assert r.returncode == 0, r.stderr
    assert "2 processes share the sweep: 6 cells and 2 book references" in r.stderr, r.stderr
    # One aggregated progress line source (rank 0), the other rank's lines prefixed.
    assert all(not l.startswith("[progress]") or "tok" in l for l in r.stderr.splitlines())
    assert "[rank 1] kl-sweep: done:" in r.stderr, r.stderr
    assert "results: " in r.stdout and "(6 cells: 6 computed now" in r.stdout, r.stdout
    assert r.stdout.count("results: ") == 1  # the summary comes from rank 0 alone
    assert_same_values(single, out)
    assert not parts(out).exists() and not (tmp_path / f".{out.name}.lock").exists()
    with h5py.File(out, "r") as f, h5py.File(single, "r") as g:
        assert f.attrs["sweep"] == g.attrs["sweep"]  # the same identity: either resumes the other
    # Run again: complete, nothing to do, on every rank.
    again = run(2, books, out)
    assert again.returncode == 0 and "already complete" in again.stderr, again.stderr


@pytest.mark.parametrize("victim", [1, 0])  # rank 0 dies holding the lock
def test_a_killed_rank_loses_no_other_cell_and_the_rerun_completes(mpi_ready, books, single, tmp_path, victim):
    out = tmp_path / "killed.h5"
    proc = start(2, books, out)
    before = wait_for_cells(out, proc)
    os.kill(rank_pids(proc.pid)[victim], signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert not out.exists()
    left = sorted(p.name for p in parts(out).glob("c*-b*.h5"))
    assert set(before) <= set(left) and len(left) < CELLS, left  # every finished cell kept
    r = run(2, books, out)
    assert r.returncode == 0, r.stderr
    assert f"resuming: {len(left)} of 6" in r.stderr, r.stderr
    assert_same_values(single, out)


def test_interrupted_with_two_ranks_finished_with_three(mpi_ready, books, single, tmp_path):
    out = tmp_path / "r2r3.h5"
    proc = start(2, books, out)
    wait_for_cells(out, proc)
    proc.send_signal(signal.SIGTERM)  # mpirun forwards it to the ranks
    proc.communicate(timeout=120)
    assert not out.exists()
    done = len(list(parts(out).glob("c*-b*.h5")))
    assert 1 <= done < CELLS
    assert not list(parts(out).glob(".*tmp-*")), "a stopped rank left a temporary"
    r = run(3, books, out)
    assert r.returncode == 0, r.stderr
    assert f"resuming: {done} of 6" in r.stderr and "3 processes share the sweep" in r.stderr, r.stderr
    assert_same_values(single, out)


def test_the_lock_stops_a_second_sweep_on_the_same_output(mpi_ready, books, single, tmp_path):
    out = tmp_path / "locked.h5"
    proc = start(2, books, out)
    wait_for_cells(out, proc)
    # a plain process, and a second MPI job: both refused while rank 0 holds the lock
    plain = subprocess.run([replayssm_binary(), *sweep_args(books, out)], capture_output=True, text=True, timeout=120)
    assert plain.returncode == 2 and "is writing the same output" in plain.stderr, plain.stderr
    second = run(2, books, out)
    assert second.returncode != 0 and "is writing the same output" in second.stderr, second.stderr
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert_same_values(single, out)
