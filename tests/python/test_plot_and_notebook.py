"""KL-sweep results in Python: the documented HDF5 schema read with h5py (a file built here and one
written by the C++ sweep), replayssm_py.results and scripts/plot_kl.py (all three kinds),
notebooks/kl_vs_length.ipynb run with nbconvert, and scripts/tokenize_text.py (byte-level and a
tokenizer.json read with the tokenizers package)."""
import json
import os
import pathlib
import subprocess
import sys

import h5py
import numpy as np
import pytest

from conftest import ROOT, checkout_env
from replayssm_py import results as kl_results
from replayssm_py import text as gutenberg

PLOT = ROOT / "scripts" / "plot_kl.py"
TOKENIZE = ROOT / "scripts" / "tokenize_text.py"
NOTEBOOK = ROOT / "notebooks" / "kl_vs_length.ipynb"


def length_bucket_edges(n):
    """The C++ rule (src/eval/kl_metrics.h)."""
    e = 1
    while e * 2 <= n // 64:
        e *= 2
    e = min(max(e, 16), 1024)
    edges = [0]
    x = e
    while x < n:
        edges.append(x)
        x *= 2
    edges.append(n)
    return np.array(edges, dtype=np.int64)


def stats(kl, edges, levels=(50, 90, 99, 100)):
    """Per-book statistics as the schema defines them, from per-position KL [B, N] (percentile
    levels: version 1's by default)."""
    finite = np.isfinite(kl)
    B, N = kl.shape
    K = len(edges) - 1
    lengths = np.arange(1, N + 1)
    bucket = np.searchsorted(edges[1:], lengths, side="left")
    bsum = np.zeros((B, K))
    bcount = np.zeros((B, K), dtype=np.int64)
    for k in range(K):
        m = (bucket == k)[None, :] & finite
        bsum[:, k] = np.where(m, kl.astype(np.float64), 0).sum(axis=1)
        bcount[:, k] = m.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        bmean = bsum / bcount
    pct = np.array([np.percentile(row[np.isfinite(row)].astype(np.float64), levels)
                    if np.isfinite(row).any() else [np.nan] * len(levels) for row in kl])
    return bsum, bcount, bmean, pct


def make_results(path, n=131072, books=2, windows=(16,), seed=0):
    """A result file in the documented schema, with paper-like curves: shared checkpoints grow with
    length, separate precisions stay flat, shared fp16+rtn overflows (NaN) after 40K."""
    rng = np.random.default_rng(seed)
    edges = length_bucket_edges(n)
    pos = np.arange(1, n + 1, dtype=np.float64)
    families = {
        "shared:fp16+sr": 1e-4 * (pos / 1024) ** 0.5,
        "shared:fp16+rtn": 5e-5 * (pos / 1024) ** 0.9,
        "shared:nvfp4+sr": 4e-3 * (pos / 1024) ** 0.7,
        "shared:nvfp4+rtn": 2e-3 * (pos / 1024) ** 1.0,
        "split:nvfp4+rtn/fp32": np.full(n, 3.8e-3),
        "split:nvfp4+rtn/fp16+sr": np.full(n, 3.9e-3),
    }
    configs = []
    for fam, curve in families.items():
        for L in windows:
            policy = f"{fam}@{L}"
            kl = (curve[None, :] * rng.lognormal(0, 0.5, size=(books, n)) * (1 + 0.01 * L)).astype(np.float32)
            if fam == "shared:fp16+rtn":
                kl[:, 40000:] = np.nan
            configs.append((policy, kl))
    with h5py.File(path, "w") as f:
        a = f.attrs
        a["schema"] = "replayssm-kl-sweep"
        a["schema_version"] = np.int64(1)
        a["complete"] = np.int64(1)
        for k, v in {"toolkit_version": "0.1.0 (git test)", "git_commit": "test", "created": "2026-11-30T00:00:00Z",
                     "command_line": "pytest", "model_description": "synthetic", "model_hash": "0",
                     "model_dir": "", "text_dir": "", "tokens_dir": "", "tokenizer": "bytes",
                     "tokenization": "bytes", "reference_policy": "conv:fp32",
                     "toolkit_versions_used": '["0.1.0 (git test)"]', "sweep": "{}"}.items():
            a[k] = v
        a["n_positions"] = np.int64(n)
        a["n_books"] = np.int64(books)
        f["bucket_edges"] = edges
        names = [p.replace("/", "|") for p, _ in configs]
        f.create_dataset("config_order", data=np.array(names, dtype=object), dtype=h5py.string_dtype())
        g = f.create_group("books")
        g.create_dataset("name", data=np.array([f"b{i}" for i in range(books)], dtype=object),
                         dtype=h5py.string_dtype())
        g.create_dataset("source", data=np.array([f"b{i}.txt" for i in range(books)], dtype=object),
                         dtype=h5py.string_dtype())
        g.create_dataset("text_fnv1a64", data=np.array(["0" * 16] * books, dtype=object), dtype=h5py.string_dtype())
        g["n_tokens"] = np.full(books, n + 1, dtype=np.int64)
        g["tokens"] = np.zeros((books, n + 1), dtype=np.int32)
        cg = f.create_group("configs")
        for (policy, kl), name in zip(configs, names):
            c = cg.create_group(name)
            c.attrs["policy"] = policy
            c.attrs["config"] = json.dumps({"policy": policy, "window": int(policy.rsplit("@", 1)[1])})
            c.attrs["complete"] = np.int64(1)
            c.attrs["forward_seconds"] = 1.0
            c.attrs["kl_seconds"] = 1.0
            c.attrs["toolkit_version"] = "0.1.0 (git test)"
            c.create_dataset("kl", data=kl, chunks=(1, min(n, 65536)), compression="gzip", shuffle=True)
            bsum, bcount, bmean, pct = stats(kl, edges)
            finite = np.isfinite(kl)
            c["bucket_sum"], c["bucket_count"], c["bucket_mean"], c["percentiles"] = bsum, bcount, bmean, pct
            c["percentiles"].attrs["levels"] = np.array([50.0, 90.0, 99.0, 100.0])
            c["mean_kl"] = np.where(finite, kl, 0).astype(np.float64).sum(1) / finite.sum(1)
            c["top1"] = np.full(books, 0.99)
            c["delta_p"] = np.full(books, -1e-4)
            c["positions"] = np.full(books, n, dtype=np.int64)
            c["finite_positions"] = finite.sum(1).astype(np.int64)
            c["nonfinite_positions"] = (~finite).sum(1).astype(np.int64)
            c["ref_nonfinite_positions"] = np.zeros(books, dtype=np.int64)
            c["nonfinite_values"] = (~finite).sum(1).astype(np.int64) * 3
            ag = c.create_group("aggregate")
            ag["bucket_sum"] = bsum.sum(0)
            ag["bucket_count"] = bcount.sum(0)
            with np.errstate(invalid="ignore"):
                ag["bucket_mean"] = bsum.sum(0) / bcount.sum(0)
            flat = kl[np.isfinite(kl)].astype(np.float64)
            ag["percentiles"] = np.percentile(flat, [50, 90, 99, 100])
            ag["mean_kl"] = flat.mean()
            ag["top1"] = 0.99
            ag["delta_p"] = -1e-4
            ag["positions"] = np.int64(books * n)
            ag["finite_positions"] = np.int64(finite.sum())
            ag["nonfinite_positions"] = np.int64((~finite).sum())
            ag["ref_nonfinite_positions"] = np.int64(0)
            ag["nonfinite_values"] = np.int64((~finite).sum() * 3)
    return path


def run(args, **kw):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=600,
                          env=checkout_env(), **kw)


@pytest.fixture(scope="module")
def paper_like(tmp_path_factory):
    return make_results(tmp_path_factory.mktemp("kl") / "results.h5", windows=(4, 16, 64))


def test_no_script_shadows_a_standard_module():
    """scripts/ is first on sys.path when a script runs: a script named like a
    standard module (as scripts/tokenize.py once did) replaces it for numpy, inspect, linecache, torch."""
    clashes = sorted(p.name for p in (ROOT / "scripts").glob("*.py") if p.stem in sys.stdlib_module_names)
    assert clashes == []
    r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import tokenize, linecache; "
                        "assert hasattr(tokenize, 'detect_encoding'), tokenize.__file__" % str(ROOT / "scripts")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_load_results_and_policy_names(paper_like):
    res = kl_results.load_results(paper_like)
    assert res["n_positions"] == 131072
    assert [c["policy"] for c in res["configs"]][:3] == ["shared:fp16+sr@4", "shared:fp16+sr@16", "shared:fp16+sr@64"]
    assert list(res["edges"]) == [0, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    p = kl_results.parse_policy("split:nvfp4+rtn/fp16+sr@16,seed=2")
    assert p == {"scheme": "split", "read": ("nvfp4", "rtn"), "recur": ("fp16", "sr"), "window": 16, "seed": 2,
                 "family": "split:nvfp4+rtn/fp16+sr"}
    assert kl_results.pretty_name("split:nvfp4+rtn/fp32@16") == "separate: NVFP4+RTN read / FP32 recur, L=16"
    assert kl_results.pretty_name("shared:fp8b128+sr@16") == "shared: FP8+SR, L=16"
    assert kl_results.pretty_name("noise-floor:bf16-vs-fp32") == "noise floor: reference at BF16 vs FP32 compute"


def test_plot_length_window_and_table(paper_like, tmp_path):
    out = tmp_path / "kl.png"
    r = run([PLOT, paper_like, "-o", out])
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20000
    win = tmp_path / "win.png"
    r = run([PLOT, paper_like, "--kind", "window", "-o", win, "--configs", "nvfp4"])
    assert r.returncode == 0, r.stderr
    assert win.stat().st_size > 20000
    txt = tmp_path / "table.txt"
    r = run([PLOT, paper_like, "--kind", "table", "-o", txt, "--configs", "@16$"])
    assert r.returncode == 0, r.stderr
    assert "KL@1K" in r.stdout and "KL@128K" in r.stdout
    lines = {l.split()[0]: l.split() for l in r.stdout.splitlines() if l.startswith(("shared", "split"))}
    assert set(lines) == {"shared:fp16+sr@16", "shared:fp16+rtn@16", "shared:nvfp4+sr@16", "shared:nvfp4+rtn@16",
                          "split:nvfp4+rtn/fp32@16", "split:nvfp4+rtn/fp16+sr@16"}
    # fp16+rtn overflowed from position 40000 on: the 64K bucket is partly, the 128K bucket wholly non-finite.
    assert lines["shared:fp16+rtn@16"][3].endswith("*") and lines["shared:fp16+rtn@16"][4] == "NaN/Inf"
    assert txt.read_text().startswith("configuration")
    # RTN and SR variants sit next to each other.
    order = [l.split()[0] for l in r.stdout.splitlines() if l.startswith("shared:fp16")]
    assert order == ["shared:fp16+rtn@16", "shared:fp16+sr@16"]


def test_plot_errors_are_messages(tmp_path):
    bad = tmp_path / "bad.h5"
    with h5py.File(bad, "w") as f:
        f.attrs["schema"] = "other"
    r = run([PLOT, bad, "-o", tmp_path / "x.png"])
    assert r.returncode == 1 and "not a replayssm kl-sweep result file" in r.stderr
    r = run([PLOT, tmp_path / "missing.h5"])
    assert r.returncode == 1 and "plot_kl.py:" in r.stderr


def test_notebook_executes(paper_like, tmp_path):
    out = tmp_path / "nb.ipynb"
    env = checkout_env(REPLAYSSM_RESULTS=str(paper_like), REPLAYSSM_PANELS=os.pathsep.join([str(paper_like)] * 2))
    r = subprocess.run(["jupyter", "nbconvert", "--to", "notebook", "--execute", str(NOTEBOOK), "--output",
                        str(out), "--ExecutePreprocessor.timeout=300"], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    nb = json.loads(out.read_text())
    outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o["output_type"] == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    res = ROOT / "experiments" / "results"
    committed = len(list(res.glob("fig13_long_*_summary.h5")) or list(res.glob("fig13_long_*.h5"))) + \
        len(list(res.glob("state_error_long_*.json")))
    # KL vs length, one panel per model (here the same file twice), the window sweep, then one figure per
    # committed long-model window sweep and state-error file
    assert len(images) == 3 + committed
    text = "".join("".join(o.get("text", "")) for o in outputs)
    assert "split:nvfp4+rtn/fp32@16" in text and "KL@128K" in text


def _test_eval_binary():
    env = os.environ.get("REPLAYSSM_TEST_EVAL")
    if env:
        return pathlib.Path(env)
    cli = pathlib.Path(os.environ.get("REPLAYSSM_BIN", ROOT / "build" / "replayssm"))
    return cli.parent / "tests" / "test_eval"


def test_cpp_results_match_the_schema(tmp_path):
    """A file written by the C++ sweep (tiny real SSM model), read back with h5py and checked against
    numpy recomputations of every statistic; then plotted."""
    exe = _test_eval_binary()
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    path = tmp_path / "cpp.h5"
    r = subprocess.run([str(exe), "--no-skip", "-tc=sample result file*"], capture_output=True, text=True,
                       env=dict(os.environ, REPLAYSSM_SAMPLE_RESULTS=str(path)), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert a["schema"] == "replayssm-kl-sweep" and a["schema_version"] == 2 and a["complete"] == 1
        block = int(a["bootstrap_base_block_length"])
        e = int(length_bucket_edges(int(a["n_positions"]))[1])
        assert block == max(1, e // 8)
        sizes = np.diff(length_bucket_edges(int(a["n_positions"])))
        np.testing.assert_array_equal(f["bootstrap_block_length"][:], np.clip(sizes // 8 // block * block, block, e))
        assert a["bootstrap_resamples"] == 1000
        n, nb = int(a["n_positions"]), int(a["n_books"])
        for key in ["toolkit_version", "git_commit", "created", "command_line", "model_description", "model_hash",
                    "model_dir", "text_dir", "tokens_dir", "tokenizer", "tokenization", "reference_policy"]:
            assert isinstance(a[key], str), key
        json.loads(a["sweep"])
        assert json.loads(a["toolkit_versions_used"])
        edges = f["bucket_edges"][:]
        assert list(edges) == list(length_bucket_edges(n))
        assert f["books/tokens"].shape == (nb, n + 1) and f["books/tokens"].dtype == np.int32
        assert len(f["books/name"]) == nb
        order = [x.decode() for x in f["config_order"][:]]
        assert sorted(order) == sorted(f["configs"].keys())
        saw_nonfinite = False
        for name in order:
            g = f["configs"][name]
            assert g.attrs["complete"] == 1 and g.attrs["policy"].replace("/", "|") == name
            cfg = json.loads(g.attrs["config"])
            assert cfg["policy"] == g.attrs["policy"] and cfg["n_positions"] == n
            kl = g["kl"][:]
            assert kl.dtype == np.float32 and kl.shape == (nb, n)
            assert g["kl"].compression == "gzip" and g["kl"].chunks[0] == 1
            levels = [50, 90, 99, 99.9, 100]
            bsum, bcount, bmean, pct = stats(kl, edges, levels)
            np.testing.assert_array_equal(g["bucket_count"][:], bcount)
            np.testing.assert_allclose(g["bucket_sum"][:], bsum, rtol=1e-6, atol=1e-12)
            np.testing.assert_allclose(g["bucket_mean"][:], bmean, rtol=1e-6, atol=1e-12)
            np.testing.assert_allclose(g["percentiles"][:], pct, rtol=1e-12)  # exact: same float32 values
            assert list(g["percentiles"].attrs["levels"]) == levels
            check_v2_statistics(g, kl, edges, block, f["bootstrap_block_length"][:], levels)
            nonfinite = (~np.isfinite(kl)).sum(1)
            np.testing.assert_array_equal(g["nonfinite_positions"][:], nonfinite)
            np.testing.assert_array_equal(g["finite_positions"][:] + nonfinite, np.full(nb, n))
            saw_nonfinite |= bool(nonfinite.sum())
            ag = g["aggregate"]
            np.testing.assert_array_equal(ag["bucket_count"][:], bcount.sum(0))
            np.testing.assert_allclose(ag["bucket_sum"][:], bsum.sum(0), rtol=1e-6, atol=1e-12)
            flat = kl[np.isfinite(kl)].astype(np.float64)
            if flat.size:
                np.testing.assert_allclose(ag["percentiles"][:], np.percentile(flat, levels), rtol=1e-12)
                np.testing.assert_allclose(ag["mean_kl"][()], flat.mean(), rtol=1e-6)
            assert ag["nonfinite_positions"][()] == nonfinite.sum()
            assert 0 <= g["top1"][0] <= 1
    assert saw_nonfinite  # the sample has overflowing fp16 states
    r = run([PLOT, path, "-o", tmp_path / "cpp.png"])
    assert r.returncode == 0, r.stderr
    r = run([PLOT, path, "--kind", "window", "-o", tmp_path / "cppw.png"])
    assert r.returncode == 0, r.stderr
    r = run([PLOT, path, "--kind", "table", "--lengths", "64,600"])  # version 2: means ± their SE
    assert r.returncode == 0, r.stderr
    assert "±" in r.stdout and "block-bootstrap standard error" in r.stdout


def bootstrap_se(blocks_count, blocks_sum, edges, base, lengths, rng, resamples=1000):
    """An independent block bootstrap (numpy's generator, not the C++ stream) of sum / count over
    [B, J] base-block sums: each bucket k's base blocks joined into runs of lengths[k] / base, the
    runs resampled within each (book, bucket) stratum; returns the SE."""
    strata = []
    for k in range(len(edges) - 1):
        first, end, run = edges[k] // base, -(-edges[k + 1] // base), lengths[k] // base
        starts = np.arange(first, end, run)
        strata.append((np.add.reduceat(blocks_count[:, first:end], starts - first, axis=1),
                       np.add.reduceat(blocks_sum[:, first:end], starts - first, axis=1)))
    reps = []
    for _ in range(resamples):
        num = den = 0.0
        for counts, sums in strata:
            for b in range(counts.shape[0]):
                pick = rng.integers(0, counts.shape[1], size=counts.shape[1])
                num += sums[b, pick].sum()
                den += counts[b, pick].sum()
        reps.append(num / den)
    return np.std(reps, ddof=1)


def check_v2_statistics(g, kl, edges, block, lengths, levels):
    """The version-2 fields of a C++ result against numpy on the stored values: block sums against
    the per-position KL, per-bucket percentiles exactly, the perplexity ratio against the stored
    block sums, the spread over books by its formula and the bootstrap SE against an independent
    bootstrap (statistical agreement: two estimates from 1,000 resamples each)."""
    nb, n = kl.shape
    finite = np.isfinite(kl)
    starts = np.arange(0, n, block)
    count, kl_sum = g["block_count"][:], g["block_kl_sum"][:]
    assert count.shape == (nb, starts.size) and kl_sum.shape == (nb, starts.size)
    np.testing.assert_array_equal(count, np.add.reduceat(finite, starts, axis=1))
    np.testing.assert_allclose(kl_sum, np.add.reduceat(np.where(finite, kl, 0).astype(np.float64), starts, axis=1),
                               rtol=1e-6, atol=1e-12)
    assert (g["block_top1_agree"][:] <= count).all() and (g["block_target_count"][:] <= count).all()
    bp = g["bucket_percentiles"][:]
    assert bp.shape == (nb, len(edges) - 1, len(levels))
    for b in range(nb):
        for k in range(len(edges) - 1):
            row = kl[b, edges[k]:edges[k + 1]]
            row = row[np.isfinite(row)].astype(np.float64)
            if row.size:
                np.testing.assert_allclose(bp[b, k], np.percentile(row, levels), rtol=1e-12)
    targets, logratio = g["block_target_count"][:], g["block_logratio_sum"][:]
    ag = g["aggregate"]
    if targets.sum():
        np.testing.assert_allclose(ag["ppl_ratio"][()], np.exp(logratio.sum() / targets.sum()), rtol=1e-12)
        np.testing.assert_allclose(g["ppl_ratio"][:], np.exp(logratio.sum(1) / targets.sum(1)), rtol=1e-12)
        np.testing.assert_allclose(ag["ppl"][()] / ag["ref_ppl"][()], ag["ppl_ratio"][()], rtol=1e-12)
    book_means = g["mean_kl"][:]
    if nb >= 2 and np.isfinite(book_means).all():
        np.testing.assert_allclose(ag["mean_kl_book_se"][()], np.std(book_means, ddof=1) / np.sqrt(nb), rtol=1e-12)
    se = ag["mean_kl_se"][()]
    if count.sum() and np.isfinite(se):
        ours = bootstrap_se(count, kl_sum, edges, block, lengths, np.random.default_rng(7))
        assert abs(se / ours - 1) < 0.2, (se, ours)


GUTENBERG = ("The Project Gutenberg EBook of T\r\n\r\n*** START OF THIS PROJECT GUTENBERG EBOOK T ***\r\n\r\n"
             "{body}\r\nEnd of the Project Gutenberg EBook of T\r\n*** END OF THIS PROJECT GUTENBERG EBOOK T ***\r\n"
             "licence text\r\n")


def test_tokenize_bytes_and_manifest(tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    (text / "2.txt").write_bytes(("\ufeff" + GUTENBERG.format(body="Second book.")).encode())
    (text / "1.txt").write_bytes(GUTENBERG.format(body="First book, caf\u00e9.").encode())
    (text / "SOURCES.txt").write_text("not a book")
    body, header, footer = gutenberg.strip_gutenberg((text / "1.txt").read_bytes())
    assert body == "First book, caf\u00e9.\n".encode() and header and footer
    out = tmp_path / "tok"
    r = run([TOKENIZE, "--text-dir", text, "--tokenizer", "bytes", "--byte-offset", "3", "--out", out])
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["format"] == "replayssm-tokens" and m["strip"] == "gutenberg-v1" and m["tokenizer"] == "bytes"
    assert [b["source"] for b in m["books"]] == ["1.txt", "2.txt"]
    ids = np.load(out / "1.npy")
    assert ids.dtype == np.int32 and bytes((ids - 3).astype(np.uint8)) == body
    assert m["books"][0]["text_fnv1a64"] == f"{gutenberg.fnv1a64(body):016x}"
    assert sorted(p.name for p in out.iterdir()) == ["1.npy", "2.npy", "manifest.json"]  # no temporaries
    r = run([TOKENIZE, "--text-dir", tmp_path / "nothing", "--tokenizer", "bytes", "--out", out])
    assert r.returncode == 2 and "no text found in" in r.stderr and "pg19/test" in r.stderr


def save_word_tokenizer(model_dir, bos="<s>"):
    """A small word-level tokenizer saved as a model folder ships one: tokenizer.json (+ config)."""
    tokenizers = pytest.importorskip("tokenizers")
    words = "first second book , . caf\u00e9".split()
    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    model_dir.mkdir()
    core.save(str(model_dir / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}
    if bos is not None:
        config["bos_token"] = bos
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return core, vocab


def test_tokenize_with_a_tokenizer_json(tmp_path):
    """Only the tokenizers package is needed; where transformers is installed its fast tokenizer, loaded
    from the same folder, gives the same ids."""
    model_dir = tmp_path / "model"
    core, vocab = save_word_tokenizer(model_dir, bos={"__type": "AddedToken", "content": "<s>", "special": True})
    text = tmp_path / "text"
    text.mkdir()
    (text / "1.txt").write_bytes(GUTENBERG.format(body="First book, caf\u00e9. Unknown").encode())
    out = tmp_path / "tok"
    r = run([TOKENIZE, "--text-dir", text, "--tokenizer", model_dir, "--out", out, "--add-bos"])
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["tokenizer"] == str(model_dir) and m["add_bos"] and m["bos_token_id"] == 1
    assert m["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert m["vocab_size"] == len(vocab) and m["books"][0]["encoding"] == "utf-8"
    ids = np.load(out / "1.npy")
    assert ids.tolist() == [1] + core.encode("First book, caf\u00e9. Unknown\n", add_special_tokens=False).ids
    assert ids.tolist() == [1, 0, 4, 5, 7, 6, 0]  # "First" is not "first": [UNK]
    try:
        import transformers
    except ImportError:
        return
    fast = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert ids.tolist()[1:] == fast("First book, caf\u00e9. Unknown\n", add_special_tokens=False)["input_ids"]


def test_tokenizer_errors_name_the_file(tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    (text / "1.txt").write_bytes(GUTENBERG.format(body="first book").encode())
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run([TOKENIZE, "--text-dir", text, "--tokenizer", empty, "--out", tmp_path / "o"])
    assert r.returncode == 2 and f"{empty}: no tokenizer.json in it" in r.stderr, r.stderr
    r = run([TOKENIZE, "--text-dir", text, "--tokenizer", tmp_path / "missing", "--out", tmp_path / "o"])
    assert r.returncode == 2 and f"{tmp_path / 'missing'}: no such file or folder" in r.stderr, r.stderr
    pytest.importorskip("tokenizers")
    (empty / "tokenizer.json").write_text("{not json")
    r = run([TOKENIZE, "--text-dir", text, "--tokenizer", empty, "--out", tmp_path / "o"])
    assert r.returncode == 2 and f"{empty / 'tokenizer.json'}: not a tokenizers file" in r.stderr, r.stderr
    no_bos = tmp_path / "no_bos"
    save_word_tokenizer(no_bos, bos=None)
    r = run([TOKENIZE, "--text-dir", text, "--tokenizer", no_bos, "--out", tmp_path / "o", "--add-bos"])
    assert r.returncode == 2 and "--add-bos: tokenizer" in r.stderr and "has no BOS token" in r.stderr, r.stderr
    bad_bos = tmp_path / "bad_bos"
    save_word_tokenizer(bad_bos, bos="<bos>")
    r = run([TOKENIZE, "--text-dir", text, "--tokenizer", bad_bos, "--out", tmp_path / "o"])
    assert r.returncode == 2 and "tokenizer_config.json: field bos_token '<bos>' is not in the vocabulary" in r.stderr
    assert not (tmp_path / "o").exists()


def test_experiment_configs_parse(tmp_path):
    """Every experiments/*.toml is accepted by kl-sweep (--dry-run: books and configurations only)."""
    exe = pathlib.Path(os.environ.get("REPLAYSSM_BIN", ROOT / "build" / "replayssm"))
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    text = tmp_path / "text"
    text.mkdir()
    (text / "1.txt").write_text("x" * 300)
    configs = sorted((ROOT / "experiments").glob("*.toml"))
    assert {p.name for p in configs} >= {"fig5.toml", "fig12.toml", "fig13.toml", "table11.toml"}
    for cfg in configs:
        r = subprocess.run([str(exe), "kl-sweep", "MODEL", "--config", str(cfg), "--dry-run", "--text-dir",
                            str(text), "--length", "100"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"{cfg.name}: {r.stderr}"
        assert "configuration" in r.stderr
    fig13 = subprocess.run([str(exe), "kl-sweep", "MODEL", "--config", str(ROOT / "experiments" / "fig13.toml"),
                            "--dry-run", "--text-dir", str(text), "--length", "100"], capture_output=True, text=True)
    assert "split:nvfp4+rtn/fp16+sr@64" in fig13.stderr and "20 configurations" in fig13.stderr


def test_one_panel_from_the_cells_of_several_sweeps(tmp_path):
    """results.merge_results / plot_kl.py 'A+B': the configurations of several files of one model as one
    panel; a configuration in two files must be the same computation; other models, books or buckets refused."""
    n = 8192
    a = make_results(tmp_path / "a.h5", n=n, windows=(4,), seed=11)
    b = make_results(tmp_path / "b.h5", n=n, windows=(64,), seed=12)
    a_again = tmp_path / "a_again.h5"
    a_again.write_bytes(a.read_bytes())
    ra, rb = kl_results.load_results(a), kl_results.load_results(b)
    merged = kl_results.merge_results([ra, rb, kl_results.load_results(a_again)])
    want = [c["policy"] for c in ra["configs"]] + [c["policy"] for c in rb["configs"]]
    assert [c["policy"] for c in merged["configs"]] == want  # a's duplicates (same values) taken once
    for c in merged["configs"]:
        src = ra if c["policy"].endswith("@4") else rb
        assert np.array_equal(c["bucket_mean"], next(s for s in src["configs"] if s["policy"] == c["policy"])["bucket_mean"],
                              equal_nan=True)
    assert merged["sources"] == [str(a), str(b), str(a_again)] and merged["attrs"]["merged_from"].count(" + ") == 2
    out = tmp_path / "panels.png"
    r = run([PLOT, a, f"{a}+{b}", "-o", out])
    assert r.returncode == 0 and out.stat().st_size > 0, r.stderr

    # The same policies computed differently (another seed of the synthetic curves): refused.
    other = make_results(tmp_path / "other.h5", n=n, windows=(4,), seed=13)
    with pytest.raises(ValueError, match="different bucket means"):
        kl_results.merge_results([ra, kl_results.load_results(other)])
    # Another model, or other buckets: refused, naming the field.
    with h5py.File(b, "r+") as f:
        f.attrs["model_hash"] = "1"
    with pytest.raises(ValueError, match="attribute model_hash"):
        kl_results.merge_results([ra, kl_results.load_results(b)])
    short = make_results(tmp_path / "short.h5", n=n // 2, windows=(64,), seed=12)
    with pytest.raises(ValueError, match="n_positions|edges"):
        kl_results.merge_results([ra, kl_results.load_results(short)])
    r = run([PLOT, f"{a}+{tmp_path / 'missing.h5'}", "-o", out])
    assert r.returncode == 1 and "missing.h5 not found" in r.stderr
