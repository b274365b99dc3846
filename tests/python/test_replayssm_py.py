"""The replayssm_py package: the Gutenberg stripper and FNV-1a hash against the C++ reader (through
the result file of a tiny kl-sweep and its --tokens-dir check), result-file reading errors, labels,
the command-line wrappers' checks, and that scripts/ holds no second copy of package code."""
import ast
import json
import pathlib
import random
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT, checkout_env, replayssm_binary
from replayssm_py import goldens, plot, results, text

MODEL = ROOT / "data" / "models" / "mamba2_tiny"
LENGTH = 32


def run_script(name, *args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)], capture_output=True,
                          text=True, timeout=300, env=checkout_env())


# ---- FNV-1a ---------------------------------------------------------------------------------------

def test_fnv1a64_reference_values():
    # The published FNV-1a 64 test vectors.
    assert text.fnv1a64(b"") == 0xCBF29CE484222325
    assert text.fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert text.fnv1a64(b"foobar") == 0x85944171F73967E8
    assert text.hex64(text.fnv1a64(b"a")) == "af63dc4c8601ec8c"


# ---- the stripper against the C++ reader ------------------------------------------------------------

def hostile_books(rng):
    """{file name: raw bytes}: every marker form the rule knows, line-ending and encoding oddities."""
    def filler(n):
        words = ["alpha", "beta", "gamma", "delta", "\tindented", "caf\u00e9", "na\u00efve", "\u201cquoted\u201d"]
        return " ".join(rng.choice(words) for _ in range(n)).encode()

    high = bytes(rng.randrange(128, 256) for _ in range(64))  # not UTF-8: Latin-1 and stray bytes
    return {
        "a_crlf_bom.txt": b"\xef\xbb\xbfThe Project Gutenberg EBook of A\r\n\r\n*** START OF THIS PROJECT GUTENBERG "
                          b"EBOOK A ***\r\n\r\n\r\n" + filler(40).replace(b"gamma", b"gamma\r\n") +
                          b"\r\n\r\nEnd of the Project Gutenberg EBook of A\r\n*** END OF THIS PROJECT GUTENBERG EBOOK "
                          b"A ***\r\nlicence\r\n",
        "b_two_line_marker.txt": b"header\n***START OF THE PROJECT GUTENBERG EBOOK A LONG\nTITLE***\n" + filler(30) +
                                 b"\n*** END OF THE PROJECT GUTENBERG EBOOK ***\n",
        "c_small_print.txt": b"legal\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\n" +
                             filler(30) + b"\nEnd of Project Gutenberg's Etext of C\n",
        "d_no_marker.txt": b"\n\n \t \n" + filler(30) + b"\n\n\t\n",
        "e_high_bytes.txt": b"*** start of the project gutenberg ebook e ***\n" + high + b"\nlone\rcarriage\r" +
                            filler(10) + b"\n*** end of the project gutenberg ebook e ***\n",
        "f_unclosed_marker.txt": b"*** START OF THE PROJECT GUTENBERG EBOOK F\nline one\nline two\nline three\n"
                                 b"line four\n" + filler(20) + b"\n",
        "g_no_final_newline.txt": b"*** START OF THE PROJECT GUTENBERG EBOOK G ***\n" + filler(25),
        "h_spacing.TXT": b"  \t***   Start   Of\tThe  Project Gutenberg EBook H ***\n" + filler(25) +
                         b"\n   End of   this Project Gutenberg EBook H\n",
        "README.txt": b"not a book, never read\n",
    }


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A tiny kl-sweep (mamba2_tiny, N = 32) on the hostile books: once on byte ids the C++ reader
    makes, once on --tokens-dir ids that scripts/tokenize_text.py made (kl-sweep refuses those when its
    own stripped-text hash differs from the manifest's)."""
    exe = pathlib.Path(replayssm_binary())
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    tmp = tmp_path_factory.mktemp("sweep")
    books = hostile_books(random.Random(20261130))
    text_dir = tmp / "text"
    text_dir.mkdir()
    for name, raw in books.items():
        (text_dir / name).write_bytes(raw)
    r = run_script("tokenize_text.py", "--text-dir", text_dir, "--tokenizer", "bytes", "--out", tmp / "tokens")
    assert r.returncode == 0, r.stderr
    files = {}
    for label, extra in (("bytes", []), ("tokens", ["--tokens-dir", tmp / "tokens"])):
        out = tmp / f"{label}.h5"
        r = subprocess.run([str(exe), "kl-sweep", str(MODEL), "--text-dir", str(text_dir), "--length", str(LENGTH),
                            "--policies", "shared:fp16+rtn@16", "--threads", "1", "--progress", "off",
                            "--out", str(out), *map(str, extra)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        files[label] = out
    return books, text_dir, files


def test_stripper_and_hash_match_the_cpp_reader(sweep):
    books, text_dir, files = sweep
    expected = {pathlib.Path(n).stem: text.strip_gutenberg(raw, n)[0] for n, raw in books.items()
                if not n.startswith("README")}
    assert [p.name for p in text.list_books(text_dir)] == sorted(n for n in books if not n.startswith("README"))
    for label, path in files.items():
        with h5py.File(path, "r") as f:
            names = [x.decode() for x in f["books/name"][:]]
            hashes = [x.decode() for x in f["books/text_fnv1a64"][:]]
            n_tokens = f["books/n_tokens"][:]
            tokens = f["books/tokens"][:]
        assert names == sorted(expected), label
        for i, name in enumerate(names):
            body = expected[name]
            assert hashes[i] == text.hex64(text.fnv1a64(body)), (label, name)
            assert n_tokens[i] == len(body), (label, name)
            assert bytes(tokens[i].astype(np.uint8)) == body[:LENGTH + 1], (label, name)
        loaded = results.load_results(path)
        assert loaded["books"] == names and loaded["text_fnv1a64"] == hashes


def test_hostile_books_strip_as_documented():
    books = hostile_books(random.Random(20261130))
    body = {n: text.strip_gutenberg(raw, n) for n, raw in books.items()}
    assert body["a_crlf_bom.txt"][1:] == (True, True)
    assert b"\r" not in body["a_crlf_bom.txt"][0] and not body["a_crlf_bom.txt"][0].startswith(b"\xef")
    b = body["b_two_line_marker.txt"]
    assert b[1:] == (True, True) and not b[0].startswith((b"TITLE", b"header")) and b"END OF" not in b[0]
    assert body["c_small_print.txt"][1:] == (True, True) and b"SMALL PRINT" not in body["c_small_print.txt"][0]
    assert body["d_no_marker.txt"][1:] == (False, False) and not body["d_no_marker.txt"][0].startswith(b"\n")
    assert b"lone\rcarriage\r" in body["e_high_bytes.txt"][0]  # a CR without LF is text
    assert body["f_unclosed_marker.txt"][0].startswith(b"line one\n")  # no '***' within three lines
    assert body["g_no_final_newline.txt"][0].endswith(b"\n")
    assert body["h_spacing.TXT"][1:] == (True, True)


def test_list_books_refuses_a_broken_link(tmp_path):
    (tmp_path / "1.txt").write_bytes(b"one\n")
    (tmp_path / "2.txt").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(text.TextError, match=r"2\.txt: a symbolic link to .*gone\.txt, which does not exist"):
        text.list_books(tmp_path)
    (tmp_path / "2.txt").unlink()
    (tmp_path / "sub.txt").mkdir()  # a folder named like a book is not a book
    assert [p.name for p in text.list_books(tmp_path)] == ["1.txt"]
    with pytest.raises(text.TextError, match=r"no text found in .*1\.txt: not a directory"):
        text.list_books(tmp_path / "1.txt")


# ---- result files ----------------------------------------------------------------------------------

def minimal_results(path, **root_attrs):
    with h5py.File(path, "w") as f:
        f.attrs["schema"] = "replayssm-kl-sweep"
        f.attrs["schema_version"] = np.int64(1)
        f.attrs["complete"] = np.int64(1)
        for k, v in root_attrs.items():
            f.attrs[k] = v
        f["bucket_edges"] = np.array([0, 16, 32], np.int64)
    return path


def test_load_results_refuses_partial_files(tmp_path):
    with pytest.raises(ValueError, match=r"p\.h5: not a complete replayssm-kl-sweep file: .*books"):
        results.load_results(minimal_results(tmp_path / "p.h5"))
    with pytest.raises(ValueError, match=r"u\.h5: attribute complete is not 1: the sweep that wrote it did not finish"):
        results.load_results(minimal_results(tmp_path / "u.h5", complete=np.int64(0)))
    with pytest.raises(ValueError, match=r"v\.h5: schema_version 3, this reader knows 1 to 2"):
        results.load_results(minimal_results(tmp_path / "v.h5", schema_version=np.int64(3)))
    r = run_script("plot_kl.py", tmp_path / "p.h5", "-o", tmp_path / "x.png")
    assert r.returncode == 1 and "plot_kl.py:" in r.stderr and "not a complete" in r.stderr
    assert "Traceback" not in r.stderr


def test_percent_never_rounds_to_all_or_none():
    assert plot.percent(1, 1) == "100%" and plot.percent(0, 5) == "0%"
    assert plot.percent(99999, 100000) == "99.99%"  # not "1e+02%", not "100%"
    assert plot.percent(1, 3) == "33.33%" and plot.percent(1, 2) == "50%"
    assert plot.percent(1, 10**7) == "<0.01%"
    with pytest.raises(ValueError, match="count 3 of total 2"):
        plot.percent(3, 2)
    c = {"policy": "shared:fp16+rtn@16", "nonfinite_positions": 8, "positions": 8, "mean_kl": 1.0}
    assert plot.legend_label(c).endswith("[8 non-finite, 100%]")


def test_plot_script_checks(sweep, tmp_path):
    path = sweep[2]["bytes"]
    r = run_script("plot_kl.py", path, "--kind", "table", "--lengths", "16,x")
    assert r.returncode == 2 and "--lengths: expected comma-separated positive bucket ends" in r.stderr
    r = run_script("plot_kl.py", path, "--kind", "table", "--lengths", "16,0")
    assert r.returncode == 2 and "got '16,0'" in r.stderr
    r = run_script("plot_kl.py", path, "--configs", "fp16(")
    assert r.returncode == 1 and "--configs: 'fp16(' is not a regular expression" in r.stderr
    r = run_script("plot_kl.py", path, "--configs", "nvfp4")
    assert r.returncode == 1 and "no configuration matches ['nvfp4']" in r.stderr and "shared:fp16+rtn@16" in r.stderr
    r = run_script("plot_kl.py", path, "-o", tmp_path / "kl.xyz")
    assert r.returncode == 1 and "kl.xyz: the file suffix must name an image format" in r.stderr
    assert list(tmp_path.iterdir()) == []
    r = run_script("plot_kl.py", path, "--kind", "table", "--lengths", "16,32", "-o", tmp_path / "t.txt")
    assert r.returncode == 0, r.stderr
    assert "KL@16" in r.stdout and "KL@32" in r.stdout and (tmp_path / "t.txt").read_text() == r.stdout
    r = run_script("plot_kl.py", path, "-o", tmp_path / "kl.svg")
    assert r.returncode == 0 and (tmp_path / "kl.svg").read_bytes().lstrip().startswith(b"<?xml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kl.svg", "t.txt"]  # no temporaries


# ---- goldens ----------------------------------------------------------------------------------------

def test_model_seeds_are_those_recorded():
    """A model's seed follows its name: `make_goldens.py --only qwen3_5_tiny` once seeded it as the
    first model and made a different one than the full run."""
    for name in goldens.MODEL_NAMES:
        recorded = json.loads((ROOT / "data" / "models" / name / "golden.json").read_text())["seed"]
        assert goldens.model_seed(name) == recorded, name


# ---- scripts/ are wrappers ---------------------------------------------------------------------------

def _defined(tree):
    return {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


def test_scripts_hold_no_copy_of_package_code():
    package = set()
    for p in (ROOT / "python" / "replayssm_py").glob("*.py"):
        package |= _defined(ast.parse(p.read_text()))
    for p in sorted((ROOT / "scripts").glob("*.py")):
        tree = ast.parse(p.read_text())
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("replayssm_py")]
        assert imports, f"{p.name} does not use replayssm_py"
        assert _defined(tree) & package <= {"main"}, f"{p.name} defines {_defined(tree) & package} again"


@pytest.mark.parametrize("option,value,message", [
    ("--books", "-1", "--books must be >= 0, got -1"),  # once: all books
    ("--byte-offset", "-3", "--byte-offset must be >= 0, got -3"),  # once: negative ids written
    ("--byte-offset", "2147483400", "--byte-offset 2147483400: byte ids up to 2147483655 do not fit int32"),
])
def test_tokenize_rejects_bad_numbers(tmp_path, option, value, message):
    (tmp_path / "1.txt").write_bytes(bytes(range(1, 256)) + b"\n")
    r = run_script("tokenize_text.py", "--text-dir", tmp_path, "--tokenizer", "bytes", "--out", tmp_path / "o",
                   option, value)
    assert r.returncode == 2 and f"tokenize_text.py: {message}" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
