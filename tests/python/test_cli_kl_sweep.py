"""`replayssm kl-sweep` on hostile options, --config files and text folders: each is refused with
exit code 2 and a message that names the option (or FILE:LINE:COL and key) and what was expected;
the experiments' TOML files parse to the configurations they describe; a real sweep on the tiny
random Mamba-2 model runs."""
import os
import pathlib
import subprocess
import tomllib

import numpy as np
import pytest

from conftest import ROOT, replayssm_binary

MODEL = str(ROOT / "data" / "models" / "mamba2_tiny")


def run(args, cwd=None):
    return subprocess.run([replayssm_binary(), "kl-sweep", *args], capture_output=True, text=True, cwd=cwd)


def refused(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stderr)
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)


def dry(text_dir, tmp_path, *extra, length="64"):
    args = [MODEL, "--text-dir", str(text_dir), "--out", str(tmp_path / "r.h5"), "--dry-run", *extra]
    return args + (["--length", length] if length is not None else [])


def configurations(stderr):
    """The configuration lines a run prints after 'kl-sweep: reference ...'."""
    lines = stderr.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("kl-sweep: reference"))
    out = []
    for l in lines[start + 1:]:
        if not l.startswith("  "):
            break
        out.append(l.strip())
    return out


# ---- options ------------------------------------------------------------------------------------

BAD_OPTIONS = [
    # empty lists used to run the default set
    (["--policies", ""], ["--policies: empty policy list ''", "a policy list is P1,P2,..."]),
    (["--policies", ",,"], ["--policies: policy list ',,': piece 1 is empty"]),
    (["--policies", "shared:nvfp4+sr,,conv:fp32"], ["piece 2 is empty"]),
    (["--policies", ",foo=1"], ["'foo=1' is an option, but no policy comes before it", "SCHEME:FORMAT"]),
    (["--policies", "shared:nvfp4+sr,foo=1"], ["--policies: invalid precision policy", "unknown option 'foo=1'"]),
    (["--policies", "shared:nvfp4+rtn,seed=3"], ["--policies:", "uses no stochastic rounding"]),
    (["--policies", "shared:nvfp4+sr@0"], ["--policies:", "window L must be at least 1"]),
    # --length 0 said "required"; over-range values were clamped to INT64_MAX
    (["--length", "0"], ["--length: '0' is not a positive integer up to 2^40"]),
    (["--length", "-5"], ["--length: '-5' is not a positive integer"]),
    (["--length", "9223372036854775807"], ["--length: '9223372036854775807' is not a positive integer up to 2^40"]),
    (["--length", "99999999999999999999"], ["--length: '99999999999999999999' is not"]),
    (["--length", "64k"], ["--length: '64k' is not"]),
    (["--length", "\uff16\uff14"], ["--length: '\uff16\uff14' is not"]),  # full-width digits
    # seeds -1 and 2^64 became 2^64 - 1
    (["--seeds", "-1"], ["--seeds: '-1' is not a non-negative integer below 2^64"]),
    (["--seeds", "18446744073709551616"], ["--seeds: '18446744073709551616' is not a non-negative integer below 2^64"]),
    (["--seeds", ""], ["--seeds: '' is an empty list"]),
    (["--seeds", "1,1"], ["--seeds: seed 1 is listed twice"]),
    (["--windows", "0"], ["--windows: '0' is not a window: an integer in [1, 1048576]"]),
    (["--windows", "-4"], ["--windows: '-4' is not a window"]),
    (["--windows", "1048577"], ["--windows: '1048577' is not a window"]),
    (["--windows", "4,,8"], ["--windows: '4,,8' has an empty entry"]),
    (["--windows", "1,1"], ["--windows: window 1 is listed twice"]),
    (["--windows", "4", "--windows", "4"], ["--windows: window 4 is listed twice"]),
    (["--chunk", "0"], ["--chunk: '0' is not an integer in [1, 1048576]"]),
    (["--chunk", "2147483648"], ["--chunk: '2147483648' is not an integer in [1, 1048576]"]),
    (["--threads", "-1"], ["--threads: '-1' is not an integer in [0, 1024] (0: all cores)"]),
    (["--threads", "100000"], ["--threads: '100000' is not"]),
    (["--byte-offset", "-1"], ["--byte-offset: '-1' is not an integer in [0, 2147483392]"]),
    (["--byte-offset", "2147483393"], ["--byte-offset: '2147483393' is not an integer in [0, 2147483392]"]),
    (["--books", "-1"], ["--books: '-1' is not a non-negative integer below 2^31"]),
    (["--progress", "fancy"], ["--progress: 'fancy' is not one of 'auto', 'bar', 'lines', 'off'"]),
    (["--short-books", "maybe"], ["--short-books: 'maybe' is not one of 'error', 'skip'"]),
    (["--device", "gpu"], ["--device: 'gpu' is not one of 'cpu', 'cuda', 'auto'"]),
    (["--compute", "fp16"], ["--compute: 'fp16' is not one of 'fp32', 'bf16x3', 'bf16'"]),
    (["--reference", "shared:nvfp4"], ["--reference: invalid precision policy 'shared:nvfp4'", "missing window"]),
    (["--chunk", "64", "--chunk", "128"], ["--chunk: given 2 times ('64', '128'); give it once"]),
    (["--tokens-dir", ""], ["--tokens-dir: empty"]),
    (["--tokens-dir", "tok", "--byte-offset", "3"], ["--byte-offset applies to byte-level ids only"]),
]


@pytest.mark.parametrize("extra,fragments", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_option_is_refused(text_dir, tmp_path, extra, fragments):
    args = dry(text_dir, tmp_path, *extra, length=None if "--length" in extra else "64")
    refused(run(args), *fragments)


def test_required_options_and_empty_paths(text_dir, tmp_path):
    refused(run([MODEL, "--text-dir", str(text_dir), "--out", "r.h5"]),
            "--length is required (on the command line or as 'length' in the --config file)")
    refused(run(dry(text_dir, tmp_path, "--out", "")), "--out: given 2 times")
    refused(run([MODEL, "--text-dir", str(text_dir), "--length", "8", "--out", ""]), "--out: empty")
    refused(run([MODEL, "--text-dir", "", "--length", "8", "--out", "r.h5"]), "--text-dir: empty")
    refused(run(["", "--text-dir", str(text_dir), "--length", "8", "--out", "r.h5"]), "MODEL_DIR: empty")


def test_list_options_take_one_word_per_occurrence(text_dir, tmp_path):
    # "--policies a b" used to take b as a policy too (and swallow MODEL_DIR given after it).
    r = run(["--text-dir", str(text_dir), "--length", "64", "--out", "r.h5", "--dry-run",
             "--policies", "shared:nvfp4+sr", MODEL])
    assert r.returncode == 0, r.stderr
    assert configurations(r.stderr) == ["shared:nvfp4+sr@16"]
    r = run(dry(text_dir, tmp_path, "--policies", "shared:nvfp4+sr", "--policies", "conv:fp16+sr,seed=5",
                "--windows", "4,8", "--windows", "16", "--seeds", "0", "--seeds", "18446744073709551615"))
    assert r.returncode == 0, r.stderr
    assert configurations(r.stderr) == [
        "shared:nvfp4+sr@4", "shared:nvfp4+sr@4,seed=18446744073709551615", "shared:nvfp4+sr@8",
        "shared:nvfp4+sr@8,seed=18446744073709551615", "shared:nvfp4+sr@16",
        "shared:nvfp4+sr@16,seed=18446744073709551615", "conv:fp16+sr,seed=5"]


def test_windows_and_seeds_no_policy_takes_are_noted(text_dir, tmp_path):
    r = run(dry(text_dir, tmp_path, "--policies", "shared:nvfp4+sr@8,conv:fp16+rtn", "--windows", "4,16",
                "--seeds", "3"))
    assert r.returncode == 0, r.stderr
    assert "note: windows 4,16 are not used" in r.stderr
    assert "note: seeds 3 are not used" not in r.stderr  # shared:nvfp4+sr@8 takes them
    assert configurations(r.stderr) == ["shared:nvfp4+sr@8,seed=3", "conv:fp16+rtn"]
    r = run(dry(text_dir, tmp_path, "--policies", "shared:nvfp4+rtn", "--seeds", "3,4"))
    assert "note: seeds 3,4 are not used" in r.stderr and "note: windows" not in r.stderr


# ---- --config files ----------------------------------------------------------------------------

BAD_TOML = [
    # an unclosed array used to swallow the lines after it
    ('policies = ["shared:nvfp4+sr",\n"conv:fp32"\nlength = 64\n', ":3:1: invalid TOML", "expected comma or closing ']'"),
    # "length =" used to say "--length is required"
    ("length =\n", ":1:9: invalid TOML", "expected value"),
    ('length = "8k"\n', ":1:10: key 'length': expected a positive integer up to 2^40", 'got the string "8k"'),
    ("length = 64.0\n", ":1:10: key 'length'", "got the float 64.0"),
    ("length = 0\n", ":1:10: key 'length': expected a positive integer", "got 0"),
    ("length = 64\nlength = 65\n", ":2:", "cannot redefine existing integer 'length'"),
    ("length = 64\n[kl-sweep]\nlength = 65\n", ":1:1: key 'length' is also set at line 3"),
    ("[kl-sweep.extra]\nx = 1\n", ": table [kl-sweep.extra] is not part of the format", "[kl-sweep] table"),
    ("[sweep]\nlength = 64\n", ":1:2: table [sweep] is not part of the format"),
    ("[[runs]]\nlength = 64\n", "array of tables [[runs]] is not part of the format"),
    ("lenght = 64\n", ":1:1: unknown key 'lenght'", "the keys are the kl-sweep options without '--'"),
    ('text_dir = "x"\n', "unknown key 'text_dir' (did you mean 'text-dir'?)"),
    ('config = "other.toml"\n', "unknown key 'config'"),
    ("windows = []\n", ":1:11: key 'windows': an empty array", "leave the key out for the default"),
    ('windows = [4, "8"]\n', "key 'windows', element 2: expected a window: an integer in [1, 1048576]"),
    ("windows = 16\n", "key 'windows': expected an array of windows", "got the integer 16"),
    ("seeds = [-1]\n", "key 'seeds', element 1: expected a seed: a non-negative integer", "got -1"),
    ('policies = ",,"\n', "key 'policies': expected an array of policy lists"),
    ('policies = [",foo=1"]\n', "key 'policies', element 1: policy list ',foo=1'", "no policy comes before it"),
    ("policies = [16]\n", "key 'policies', element 1: expected a policy string", "got the integer 16"),
    ('force = "yes"\n', ":1:9: key 'force': expected true or false", 'got the string "yes"'),
    ('progress = "fancy"\n', "key 'progress': 'fancy' is not one of"),
    ("chunk = {rows = 4}\n", "key 'chunk': expected an integer in [1, 1048576]", "got a table"),
    ('text-dir = "\\u0000"\n', "key 'text-dir': contains a NUL character"),
    (b'length = "\xff"\n', ":1:10: invalid TOML", "invalid utf-8"),
]


@pytest.mark.parametrize("toml,fragments", [(t[0], t[1:]) for t in BAD_TOML], ids=[str(i) for i in range(len(BAD_TOML))])
def test_bad_config_file_names_file_line_and_key(text_dir, tmp_path, toml, fragments):
    cfg = tmp_path / "bad.toml"
    cfg.write_bytes(toml if isinstance(toml, bytes) else toml.encode())
    # The file's keys come after the command line's: leave out what the file sets.
    args = [MODEL, "--out", str(tmp_path / "r.h5"), "--dry-run", "--config", str(cfg)]
    text = toml.decode(errors="replace") if isinstance(toml, bytes) else toml
    if "text-dir" not in text:
        args += ["--text-dir", str(text_dir)]
    if "length" not in text:
        args += ["--length", "64"]
    r = run(args)
    refused(r, *fragments)
    assert str(cfg) in r.stderr or "bad.toml" in r.stderr, r.stderr


def test_config_path_problems(tmp_path, text_dir):
    base = [MODEL, "--text-dir", str(text_dir), "--length", "64", "--out", "r.h5", "--dry-run"]
    refused(run(base + ["--config", str(tmp_path)]), f"--config {tmp_path}: not a regular file")
    refused(run(base + ["--config", str(tmp_path / "none.toml")]), "none.toml: no such file")
    (tmp_path / "a.toml").write_text("")
    refused(run(base + ["--config", str(tmp_path / "a.toml"), "--config", str(tmp_path / "a.toml")]),
            "--config: given more than once")


def test_bom_crlf_and_kl_sweep_table(tmp_path, text_dir):
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b"\xef\xbb\xbf# comment\r\n[kl-sweep]\r\nlength = 64\r\npolicies = [\r\n  \"shared:nvfp4+sr\",\r\n"
                    b"  \"split:nvfp4/fp32\",\r\n]\r\nwindows = [4, 8]\r\n")
    r = run([MODEL, "--text-dir", str(text_dir), "--out", "r.h5", "--dry-run", "--config", str(cfg)])
    assert r.returncode == 0, r.stderr
    assert "N = 64 positions" in r.stderr
    assert configurations(r.stderr) == ["shared:nvfp4+sr@4", "shared:nvfp4+sr@8", "split:nvfp4+rtn/fp32@4",
                                        "split:nvfp4+rtn/fp32@8"]


def test_command_line_replaces_the_files_value(tmp_path, text_dir):
    cfg = tmp_path / "c.toml"
    cfg.write_text('length = 128\npolicies = ["shared:nvfp4+sr", "conv:fp16+sr"]\nwindows = [4, 8]\n'
                   'seeds = [0, 1]\nout = "from-file.h5"\nthreads = 2\n')
    base = [MODEL, "--text-dir", str(text_dir), "--dry-run", "--config", str(cfg)]
    r = run(base)
    assert r.returncode == 0, r.stderr
    assert "N = 128 positions" in r.stderr and "results would go to from-file.h5" in r.stderr
    assert len(configurations(r.stderr)) == 6
    # Each option on the command line replaces the file's value; lists are not merged.
    r = run(base + ["--length", "64", "--windows", "16", "--out", "cli.h5"])
    assert r.returncode == 0, r.stderr
    assert "N = 64 positions" in r.stderr and "results would go to cli.h5" in r.stderr
    assert configurations(r.stderr) == ["shared:nvfp4+sr@16", "shared:nvfp4+sr@16,seed=1", "conv:fp16+sr",
                                        "conv:fp16+sr,seed=1"]
    # A bad command-line value is reported as the option even when the file's value is fine.
    refused(run(base + ["--length", "0"]), "--length: '0' is not")


def expected_configurations(cfg):
    """The configurations a sweep file describes, expanded here independently of the C++."""
    windows, seeds = cfg.get("windows", [16]), cfg.get("seeds", [0])
    out = []
    for p in cfg["policies"]:
        scheme = p.split(":")[0]
        with_window = [f"{p}@{L}" for L in windows] if scheme in ("shared", "split") and "@" not in p else [p]
        for q in with_window:
            for s in (seeds if "+sr" in q else [0]):
                name = q if s == 0 else f"{q},seed={s}"
                if name not in out:
                    out.append(name)
    return out


@pytest.mark.parametrize("name", ["fig5", "fig12", "fig13", "table11"])
def test_experiment_files_parse_to_their_settings(name, tmp_path, text_dir):
    path = ROOT / "experiments" / f"{name}.toml"
    cfg = tomllib.loads(path.read_text())
    args = [MODEL, "--config", str(path), "--dry-run"]
    have_books = (ROOT / cfg["text-dir"]).is_dir()
    if not have_books:  # the shared PG-19 books are not on every machine: only text-dir differs then
        args += ["--text-dir", str(text_dir), "--length", "64"]
    r = run(args, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert configurations(r.stderr) == expected_configurations(cfg)
    assert f"results would go to {cfg['out']}" in r.stderr
    if have_books:
        assert f"from {cfg['text-dir']} (bytes" in r.stderr
        assert f"N = {cfg['length']} positions" in r.stderr


# ---- text folders ------------------------------------------------------------------------------

def test_text_dir_problems(tmp_path, text_dir):
    def sweep_on(d, *extra):
        return run([MODEL, "--text-dir", str(d), "--length", "64", "--out", str(tmp_path / "r.h5"), "--dry-run",
                    *extra])

    # A broken .txt link used to be skipped, so a folder of them said "no .txt books".
    links = tmp_path / "links"
    links.mkdir()
    os.symlink(tmp_path / "missing.txt", links / "book.txt")
    refused(sweep_on(links), str(links / "book.txt") + ": a broken symbolic link", "missing.txt")
    # A file, a missing folder, a folder with no books.
    refused(sweep_on(text_dir / "a.txt"), "a.txt: not a directory")
    refused(sweep_on(tmp_path / "nowhere"), "the directory does not exist")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "README.txt").write_text("notes\n")
    refused(sweep_on(empty), "no .txt books in it")
    # Two names for one book.
    (text_dir / "a.TXT").write_text("x" * 100)
    refused(sweep_on(text_dir), "a.TXT and a.txt are both book 'a'")
    (text_dir / "a.TXT").unlink()
    # An empty book, a book shorter than --length, a footer without a header.
    (text_dir / "c.txt").write_text("\n\n  \n")
    refused(sweep_on(text_dir), "c.txt: empty after removing the Project Gutenberg header and footer")
    (text_dir / "c.txt").write_text("short\n")
    refused(sweep_on(text_dir), "c.txt: 6 tokens after stripping", "--length 64 needs 65", "--short-books skip")
    r = sweep_on(text_dir, "--short-books", "skip")
    assert r.returncode == 0 and "skipped" in r.stderr and "c.txt" in r.stderr, r.stderr
    (text_dir / "c.txt").write_text("body\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\n")
    refused(sweep_on(text_dir), "c.txt: has a Project Gutenberg footer", "no \"*** START OF ...\" header")


def test_books_without_markers_or_in_other_encodings_are_taken_whole(tmp_path, text_dir):
    # Not UTF-8 (Latin-1 bytes) and no Gutenberg markers: byte-level ids are the bytes, said so in the log.
    (text_dir / "c.txt").write_bytes(bytes(range(128, 256)) * 2 + b"\n")
    r = run([MODEL, "--text-dir", str(text_dir), "--length", "64", "--out", "r.h5", "--dry-run"])
    assert r.returncode == 0, r.stderr
    assert "c                  257 tokens  (no Gutenberg header: taken whole)" in r.stderr


def test_tokens_dir_problems(tmp_path, text_dir):
    tok = tmp_path / "tok"
    tok.mkdir()
    base = [MODEL, "--text-dir", str(text_dir), "--length", "64", "--out", "r.h5", "--dry-run", "--tokens-dir",
            str(tok)]
    refused(run(base), "no manifest.json")
    (tok / "manifest.json").write_text("{not json")
    refused(run(base), "manifest.json: malformed token manifest")
    (tok / "manifest.json").write_text('{"format": "replayssm-tokens", "version": 1, "strip": "gutenberg-v1", '
                                       '"tokenizer": "t", "books": {"a": 1}}')
    refused(run(base), 'field "books" is not an array')


# ---- a real sweep ------------------------------------------------------------------------------

def test_small_sweep_runs_from_a_config_file(tmp_path, text_dir):
    h5py = pytest.importorskip("h5py")
    cfg = tmp_path / "sweep.toml"
    out = tmp_path / "res.h5"
    cfg.write_text(f'model-dir = "{MODEL}"\n[kl-sweep]\ntext-dir = "{text_dir}"\nlength = 64\n'
                   f'policies = ["conv:fp32", "shared:nvfp4+sr"]\nwindows = [4]\nchunk = 16\nthreads = 1\n'
                   f'progress = "off"\nout = "{out}"\n')
    r = run(["--config", str(cfg)])
    assert r.returncode == 0, r.stderr
    assert f"results: {out}" in r.stdout
    with h5py.File(out, "r") as f:
        assert f.attrs["n_positions"] == 64
        assert [n.decode() if isinstance(n, bytes) else n for n in f["config_order"][:]] == \
            ["conv:fp32", "shared:nvfp4+sr@4"]
        exact = f["configs"]["conv:fp32"]["kl"][:]
        assert exact.shape == (2, 64) and (exact == 0).all()  # the reference against itself: exactly 0
        lossy = f["configs"]["shared:nvfp4+sr@4"]["kl"][:]
        assert (lossy >= 0).all() and lossy.max() > 0
        assert f.attrs["device"] == "cpu"  # --device auto on a machine without a GPU
    assert "kl-sweep: device: cpu (auto: " in r.stderr


def gpu_present():
    return subprocess.run(["sh", "-c", "command -v nvidia-smi && nvidia-smi -L"], capture_output=True).returncode == 0


def test_device_and_compute_that_cannot_be_honoured_are_refused(tmp_path, text_dir):
    base = [MODEL, "--text-dir", str(text_dir), "--length", "16", "--policies", "conv:fp32", "--progress", "off"]
    r = run(base + ["--out", str(tmp_path / "a.h5"), "--compute", "bf16", "--device", "cpu"])
    refused(r, "--compute bf16: the CPU computes in FP32 only; use --device cuda")
    assert not (tmp_path / "a.h5").exists()
    if gpu_present():
        pytest.skip("a GPU is present: --device cuda can run here (the GPU suites cover it)")
    r = run(base + ["--out", str(tmp_path / "b.h5"), "--device", "cuda"])
    refused(r, "--device cuda: ", "; use --device cpu")
    r = run(base + ["--out", str(tmp_path / "c.h5"), "--compute", "bf16x3"])
    refused(r, "--compute bf16x3: the CPU computes in FP32 only; --device auto chose the CPU: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == [text_dir.name]  # no result, lock or work folder


def test_error_feedback_policies_run_on_the_cpu_and_are_recorded(tmp_path, text_dir):
    """'+ef' (error feedback) reaches the model: a sweep with it differs from the same policy with
    RTN, stays finite, records error_feedback in each configuration's JSON, and --device auto says
    it computed on the CPU (the GPU scan kernels refuse ef; on a GPU machine auto falls back)."""
    h5py = pytest.importorskip("h5py")
    import json
    out = tmp_path / "ef.h5"
    r = run([MODEL, "--text-dir", str(text_dir), "--length", "64", "--policies",
             "conv:bf16+ef,conv:bf16+rtn,shared:nvfp4+ef@4,split:nvfp4+ef/fp32@4", "--threads", "1",
             "--progress", "off", "--out", str(out)])
    assert r.returncode == 0, r.stderr
    assert "kl-sweep: device: cpu" in r.stderr
    if gpu_present():
        assert "error feedback (+ef)" in r.stderr  # auto's reason for the CPU
    with h5py.File(out, "r") as f:
        cfg = f["configs"]
        ef, rtn = cfg["conv:bf16+ef"]["kl"][:], cfg["conv:bf16+rtn"]["kl"][:]
        assert np.isfinite(ef).all() and (ef >= 0).all() and ef.max() > 0
        assert not np.array_equal(ef, rtn)
        for name in ["conv:bf16+ef", "shared:nvfp4+ef@4", "split:nvfp4+ef|fp32@4"]:
            meta = json.loads(cfg[name].attrs["config"])
            assert meta["error_feedback"] is True and meta["stochastic_rounding"] is False, (name, meta)
        assert json.loads(cfg["conv:bf16+rtn"].attrs["config"])["error_feedback"] is False
