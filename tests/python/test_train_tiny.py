"""scripts/train_tiny.py and replayssm_py.train: Gutenberg stripping of training-shaped books, the PG-19
test-set refusal, option checks, and a few training steps of the three architectures on the CPU (tiny preset,
synthetic books, temporary folders): reload with transformers and replayssm, resume bit for bit after a
stop, the context schedule, the long-memory initialisation and the card's decay spectrum.

The stripping and refusal tests need only the standard library. The training tests need torch and
transformers; without them they are skipped with the reason shown (pytest -rs). Run:
    python3 -m pytest -q -rs tests/python/test_train_tiny.py
"""
import hashlib
import json
import math
import os
import pathlib
import random
import struct
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, checkout_env, replayssm_binary
from replayssm_py import text
from replayssm_py import train as tt
from replayssm_py import train_resume

SCRIPT = ROOT / "scripts" / "train_tiny.py"
SHARED = ROOT.parent / "shared" / "data"


def _torch_problem():
    """None when torch and transformers (with the Mamba-2 and Qwen3.5 classes) import, else why not."""
    try:
        import torch  # noqa: F401
        import transformers
    except Exception as e:  # ImportError, or a broken installation
        return f"torch/transformers not importable ({type(e).__name__}: {e})"
    classes = ("Mamba2ForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5TextConfig", "NemotronHForCausalLM",
               "NemotronHConfig")
    missing = [c for c in classes if not hasattr(transformers, c)]
    if missing:
        return f"transformers {transformers.__version__} lacks {', '.join(missing)}"
    return None


TORCH_PROBLEM = _torch_problem()
needs_torch = pytest.mark.skipif(TORCH_PROBLEM is not None,
                                 reason=f"{TORCH_PROBLEM}: train_tiny.py's training, reload and scan tests need "
                                        "them (CI installs neither)")


WORDS = ("the of and to a in that it was he she his her with as for had you not be on at by which have or from "
         "this him but all they were my are me one their so an said them we who would been will no when there "
         "if more out up into do any your what has man could other than our some very time upon about may its "
         "only now like little then can should made did us such great before must two these see know over much "
         "down after first good men own never old day way").split()


def fake_book(seed, n_words, title, crlf=True, bom=False, two_line_marker=False, small_footer=True):
    """A Project Gutenberg-shaped file of pseudo-English (header, body, licence footer)."""
    rng = random.Random(seed)
    body_lines, line = [], []
    for i in range(n_words):
        w = rng.choice(WORDS)
        line.append(w.capitalize() if not line or rng.random() < 0.05 else w)
        if rng.random() < 0.08:
            line[-1] += rng.choice([".", ",", ";", "!", "?"])
        if len(" ".join(line)) > 60:
            body_lines.append(" ".join(line))
            line = []
            if rng.random() < 0.15:
                body_lines.append("")
    body_lines.append(" ".join(line) + ".")
    head = [f"The Project Gutenberg EBook of {title}", "", "This eBook is for the use of anyone anywhere.", ""]
    if two_line_marker:
        head += [f"***START OF THE PROJECT GUTENBERG EBOOK {title.upper()} AND A VERY LONG", "SUBTITLE***"]
    else:
        head += [f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***"]
    foot = ([f"End of the Project Gutenberg EBook of {title}", ""] if small_footer else []) + \
        [f"*** END OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***", "", "Updated editions will replace the "
         "previous one.", "START: FULL LICENSE"]
    text = "\n".join(head + ["", "", "Produced by nobody.", "", ""] + body_lines + ["", "", ""] + foot) + "\n"
    if crlf:
        text = text.replace("\n", "\r\n")
    raw = text.encode()
    return (b"\xef\xbb\xbf" + raw) if bom else raw, ("\n".join(["Produced by nobody.", "", ""] + body_lines) +
                                                      "\n").encode()


def make_dirs(tmp_path, n_train=3, train_words=6000):
    train = tmp_path / "gutenberg-train"
    pg19 = tmp_path / "pg19" / "test"
    train.mkdir()
    pg19.mkdir(parents=True)
    for i in range(n_train):
        raw, _ = fake_book(100 + i, train_words, f"Training Book {i}", crlf=i % 2 == 0, two_line_marker=i == 1)
        (train / f"{2000 + i}.txt").write_bytes(raw)
    (train / "SOURCES.txt").write_text("not a book\n")
    for i, name in enumerate(["10146.txt", "10321.txt", "10356.txt", "10762.txt"]):
        raw, _ = fake_book(200 + i, 400, f"Test Book {i}", bom=i == 3, small_footer=i % 2 == 1)
        (pg19 / name).write_bytes(raw)
    return train, pg19


def run_script(args, timeout=120):
    env = checkout_env(PYTHONHASHSEED="0", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


# ---- stripping ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("crlf,bom,two_line,small_footer", [(True, False, False, True), (False, True, True, False),
                                                           (True, True, True, True)])
def test_strip_gutenberg_keeps_exactly_the_body(crlf, bom, two_line, small_footer):
    raw, body = fake_book(7, 500, "A Title", crlf=crlf, bom=bom, two_line_marker=two_line,
                          small_footer=small_footer)
    out, header, footer = text.strip_gutenberg(raw)
    assert out == body and header and footer
    assert b"\r" not in out and not out.startswith(b"\xef\xbb\xbf") and b"GUTENBERG" not in out.upper()


def test_strip_gutenberg_edge_cases():
    assert text.strip_gutenberg(b"\n\n  \nplain text\r\nno markers\n\n") == \
        (b"plain text\nno markers\n", False, False)
    with pytest.raises(text.TextError, match=r"^book.txt: has a Project Gutenberg footer .* but no \"\*\*\* START OF"):
        text.strip_gutenberg(b"text\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\n", "book.txt")
    with pytest.raises(text.TextError, match=r"^b.txt: empty after removing the Project Gutenberg header and footer "
                                             r"\(header marker found, footer marker found\)"):
        text.strip_gutenberg(b"*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n*** END OF THE PROJECT GUTENBERG "
                             b"EBOOK X ***\n", "b.txt")
    # a marker that never closes: the body starts on the line after it
    assert text.strip_gutenberg(b"h\n*** START OF THE PROJECT GUTENBERG EBOOK X\n\nbody\n")[0] == b"body\n"


# ---- never the PG-19 test books ---------------------------------------------------------------------------

def test_refuses_the_pg19_test_folder(tmp_path):
    train, pg19 = make_dirs(tmp_path, n_train=1, train_words=200)
    out = tmp_path / "out"
    common = ["--arch", "mamba2", "--out", out, "--pg19-dir", pg19, "--device", "cpu"]

    r = run_script(["--train-dir", pg19, *common])
    assert r.returncode == 2 and "refusing to train on the PG-19 test books" in r.stderr, r.stderr
    r = run_script(["--train-dir", tmp_path / "pg19" / ".." / "pg19" / "test", *common])
    assert r.returncode == 2 and "is the PG-19 test folder" in r.stderr, r.stderr

    (train / "10321.txt").write_bytes(b"whatever\n")  # a test book's name
    r = run_script(["--train-dir", train, *common])
    assert r.returncode == 2 and "10321.txt" in r.stderr and "name of PG-19 test book" in r.stderr, r.stderr
    (train / "10321.txt").unlink()

    (train / "renamed.txt").write_bytes((pg19 / "10762.txt").read_bytes())  # a test book's contents
    r = run_script(["--train-dir", train, *common])
    assert r.returncode == 2 and "same contents as PG-19 test book 10762.txt" in r.stderr, r.stderr
    (train / "renamed.txt").unlink()

    other = tmp_path / "elsewhere" / "pg19" / "test"  # any folder named pg19/test, even with another --pg19-dir
    other.mkdir(parents=True)
    (other / "1.txt").write_bytes(b"text\n")
    r = run_script(["--train-dir", other, *common])
    assert r.returncode == 2 and "PG-19 test folder" in r.stderr, r.stderr
    assert not out.exists()


def test_refuses_the_real_pg19_test_folder(tmp_path):
    if not (SHARED / "pg19" / "test").is_dir():
        pytest.skip(f"{SHARED / 'pg19' / 'test'} not present")
    r = run_script(["--arch", "qwen3_5", "--train-dir", SHARED / "pg19" / "test", "--out", tmp_path / "o"])
    assert r.returncode == 2 and "refusing to train on the PG-19 test books" in r.stderr, r.stderr


def test_schedule_and_command_helpers():
    lrs = [tt.lr_at(s, 100, 10, 1e-3) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[-1] == pytest.approx(1e-4)
    assert tt.with_option(["--steps", "5", "--seed=3", "--minutes=2"], "--minutes", "0") == \
        ["--steps", "5", "--seed=3", "--minutes", "0"]


@pytest.mark.parametrize("option,value,message", [
    ("--minutes", "nan", "--minutes must be a finite number >= 0 (0: no budget), got nan"),
    ("--minutes", "-1", "--minutes must be a finite number >= 0 (0: no budget), got -1.0"),
    ("--lr", "nan", "--lr must be a finite number > 0, got nan"),
    ("--lr", "0", "--lr must be a finite number > 0, got 0.0"),
    ("--weight-decay", "inf", "--weight-decay must be a finite number >= 0, got inf"),
    ("--eval-chunk", "0", "--eval-chunk must be positive, got 0"),
    ("--eval-chunk", "-5", "--eval-chunk must be positive, got -5"),
    ("--seq-len", "0", "--seq-len must be positive, got 0"),
])
def test_rejects_bad_numbers(tmp_path, option, value, message):
    """A NaN budget once meant no budget, --eval-chunk 0 silently meant --seq-len and a negative one an
    evaluation that predicted nothing (0 bits per byte): all refused before any work, naming the option."""
    train, pg19 = make_dirs(tmp_path, n_train=1, train_words=200)
    r = run_script(["--arch", "mamba2", "--train-dir", train, "--pg19-dir", pg19, "--out", tmp_path / "o",
                    option, value])
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_missing_train_dir_is_named(tmp_path):
    r = run_script(["--arch", "mamba2", "--train-dir", tmp_path / "nope", "--pg19-dir", tmp_path / "pg19",
                    "--out", tmp_path / "o"])
    assert r.returncode == 2, r.stderr
    assert f"no text found in {tmp_path / 'nope'}: the directory does not exist; point --train-dir" in r.stderr


# ---- training on the CPU ----------------------------------------------------------------------------------

CARD_FIELDS = ["## Architecture", "- class: `", "- parameters: ", "## Config summary", "## Training text",
               "PG-19 test books excluded:", "- files: ", "## Training", "- steps: ", "- tokens seen: ",
               "- wall time: ", "- device: CPU", "- seed: 5", "- final training loss: ",
               "## Bits per byte on the PG-19 test books", "| **all** |", "## Software", "- transformers 5.",
               "torch ", "## Command", "scripts/train_tiny.py --arch"]


def safetensors_dtypes(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {v["dtype"] for k, v in header.items() if k != "__metadata__"}


ARCHS = ("mamba2", "qwen3_5", "nemotron_h", "kimi_linear")
MODEL_CLASS = {"mamba2": "Mamba2ForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM", "nemotron_h": "NemotronHForCausalLM",
               "kimi_linear": "KimiLinearForCausalLM"}
MODEL_TYPE = {"mamba2": "mamba2", "qwen3_5": "qwen3_5_text", "nemotron_h": "nemotron_h", "kimi_linear": "kimi_linear"}


SCHEDULE = "32:0,64:0.3,128:0.6"  # over 10 steps: 32 bytes for steps 0-2, 64 for 3-5, 128 for 6-9
TOKENS_PER_STEP = 256


def train_args(arch, train, pg19, out, *extra):
    return ["--arch", arch, "--preset", "tiny", "--train-dir", train, "--pg19-dir", pg19, "--out", out,
            "--steps", 10, "--seq-len-schedule", SCHEDULE, "--tokens-per-step", TOKENS_PER_STEP, "--device", "cpu",
            "--seed", 5, "--log-every", 5, "--decay-init", "log-uniform", "--eval-bytes", 1500, "--eval-chunk", 200,
            "--eval-batch", 3, "--replayssm", replayssm_binary(), "--decay-length", 1000, *extra]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Per architecture (tiny preset, CPU, 10 steps with the context schedule and the long-memory
    initialisation): one uninterrupted run without --resume-dir ("whole"), and the same training split in two
    runs ("split": --stop-after-steps 4 into --resume-dir, then the same command). The mamba2 resume folder is
    also copied at step 4 ("saved_at_4") for the damaged-file test."""
    import shutil

    if TORCH_PROBLEM is not None:
        pytest.skip(TORCH_PROBLEM)
    tmp = tmp_path_factory.mktemp("train_tiny")
    train, pg19 = make_dirs(tmp)
    runs = {}
    for arch in ARCHS:
        whole, split, rd = tmp / f"{arch}_whole", tmp / f"{arch}_split", tmp / f"{arch}_resume"
        r = run_script(train_args(arch, train, pg19, whole))
        assert r.returncode == 0, r.stderr[-3000:]
        first = run_script(train_args(arch, train, pg19, split, "--resume-dir", rd, "--stop-after-steps", 4))
        assert first.returncode == 0, first.stderr[-3000:]
        assert "stopped at step 4 of 10: --stop-after-steps 4 reached" in first.stderr
        assert not split.exists()  # nothing in --out before the last step
        manifest = json.loads((rd / "resume.json").read_text())
        assert sorted(p.name for p in rd.iterdir()) == sorted(["resume.json"] + [s["file"] for s in manifest["shards"]])
        if arch == "mamba2":
            shutil.copytree(rd, tmp / "saved_at_4")
        second = run_script(train_args(arch, train, pg19, split, "--resume-dir", rd))
        assert second.returncode == 0, second.stderr[-3000:]
        assert "resumed from" in second.stderr and "at step 4 of 10" in second.stderr
        runs[arch] = {"whole": whole, "split": split, "resume_dir": rd, "manifest_at_4": manifest}
    runs["saved_at_4"] = tmp / "saved_at_4"
    return runs, train, pg19


def have_replayssm():
    return pathlib.Path(replayssm_binary()).exists()


@needs_torch
@pytest.mark.parametrize("arch", ARCHS)
def test_checkpoint_reloads_with_transformers(trained, arch):
    import torch
    import transformers

    runs, _, pg19 = trained
    out = runs[arch]["whole"]
    files = {"config.json", "model.safetensors", "MODEL_CARD.md", "train_log.json"}
    assert {p.name for p in out.iterdir()} == files | ({"decays.json"} if have_replayssm() else set())
    assert safetensors_dtypes(out / "model.safetensors") == {"F32"}
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 256
    assert config["model_type"] == MODEL_TYPE[arch]
    assert config["architectures"] == [MODEL_CLASS[arch]]
    if arch == "qwen3_5":
        assert "full_attention" in config["layer_types"] and "linear_attention" in config["layer_types"]
        assert config["linear_num_value_heads"] > config["linear_num_key_heads"]
    if arch == "nemotron_h":  # Mamba-2, attention and MLP layers
        assert set(config["layers_block_type"]) == {"linear_attention", "full_attention", "mlp"}
    if arch == "kimi_linear":  # KDA and MLA layers, dense MLPs only, untied head
        assert set(config["layer_types"]) == {"linear_attention", "full_attention"}
        assert set(config["mlp_layer_types"]) == {"dense"} and config["tie_word_embeddings"] is False

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert type(model).__name__ == config["architectures"][0]
    log = json.loads((out / "train_log.json").read_text())
    assert sum(p.numel() for p in model.parameters()) == log["parameters"]
    body = text.strip_book(pg19 / "10321.txt")[:1500]
    ids = torch.tensor(list(body))[None]
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    assert logits.shape == (1, ids.shape[1], 256) and torch.isfinite(logits).all()
    # The streamed bits/byte in the log is this full forward's (streaming with the cache changes nothing).
    nll = torch.nn.functional.cross_entropy(logits[0, :-1].double(), ids[0, 1:], reduction="sum").item()
    book = next(b for b in log["eval"]["books"] if b["book"] == "10321.txt")
    assert book["predicted"] == ids.shape[1] - 1
    assert book["bpb_streamed"] == pytest.approx(nll / (ids.shape[1] - 1) / math.log(2), rel=1e-5)
    assert math.isfinite(book["bpb_windowed"]) and book["bpb_windowed"] > 0


@needs_torch
@pytest.mark.parametrize("arch", ARCHS)
def test_card_and_log(trained, arch):
    runs, _, _ = trained
    out = runs[arch]["whole"]
    card = (out / "MODEL_CARD.md").read_text()
    for field in CARD_FIELDS:
        assert field in card, field
    template = (ROOT / "data" / "models" / "README.md").read_text()
    for heading in (line for line in card.splitlines() if line.startswith("## ")):
        assert heading in template, f"{heading} is missing from the template in data/models/README.md"
    assert "--steps 10" in card and "2000.txt" in card and "2002.txt" in card and "SOURCES" not in card
    log = json.loads((out / "train_log.json").read_text())
    assert log["steps"] == 10 and len(log["loss"]) == 10 and len(log["lr"]) == 10
    assert all(math.isfinite(x) for x in log["loss"]) and log["loss"][-1] < log["loss"][0]
    assert log["tokens_seen"] == 10 * TOKENS_PER_STEP
    assert len(log["books"]) == 3 and log["eval"] is not None and len(log["eval"]["books"]) == 4
    assert 0 < log["eval"]["bpb_streamed"] < 9 and 0 < log["eval"]["bpb_windowed"] < 9
    assert "## Decay spectrum (how long the heads remember)" in card
    if have_replayssm():  # the spectrum replayssm measured is the one in the card
        decays = json.loads((out / "decays.json").read_text())
        s = decays["summary"]
        assert decays["positions_per_book"] == 1000 and len(decays["books"]) == 4
        assert f"heads with memory ≥ 1,000 tokens (where state errors accumulate over 128K): " \
               f"**{s['long_memory_heads']} of {s['heads']}**" in card
        assert f"mean {decays['mean_bits_per_byte']:.4f}" in card
        assert log["decays"]["summary"] == s
    else:
        assert "Measured on text: skipped (no replayssm binary at" in card


@needs_torch
@pytest.mark.parametrize("arch", ARCHS)
def test_log_traces_the_weight_implied_memories(trained, arch):
    """Every logged step records the quantiles of the memories the weights imply (input's share of dt at 0);
    the last one equals a float64 computation from the saved tensors, and the card states the trace."""
    from safetensors import safe_open
    runs, _, _ = trained
    out = runs[arch]["whole"]
    log = json.loads((out / "train_log.json").read_text())
    assert [e["step"] for e in log["log"]] == [5, 10] and all(e["memory"] for e in log["log"])
    assert all(e["memory_text"]["n"] == e["memory"]["n"] for e in log["log"])  # the trace measured on text too
    memories = []
    with safe_open(str(out / "model.safetensors"), "np") as f:
        for key in sorted(k for k in f.keys() if k.endswith("A_log")):
            a_log = f.get_tensor(key).astype(np.float64).reshape(-1)
            dt_bias = f.get_tensor(key[: -len("A_log")] + "dt_bias").astype(np.float64)
            a = np.repeat(np.exp(a_log), dt_bias.size // a_log.size)  # KDA: one A per head, dt_bias per channel
            rate = a * np.logaddexp(0.0, dt_bias)  # softplus
            memories += list(1.0 / -np.expm1(-rate))
    memories = np.sort(memories)
    m = log["log"][-1]["memory"]
    assert m["n"] == memories.size
    assert m["median"] == pytest.approx(memories[memories.size // 2], rel=1e-9)
    assert m["max"] == pytest.approx(memories[-1], rel=1e-9)
    assert m["at_least_1000"] == int((memories >= 1000).sum())
    card = (out / "MODEL_CARD.md").read_text()
    assert "Over training (from the weights at every logged step" in card and "step 5:" in card and "step 10:" in card
    assert "Over training (measured on text at every logged step" in card


@needs_torch
@pytest.mark.parametrize("arch", ARCHS)
def test_text_memories_equal_a_float64_recomputation_from_the_layer_inputs(arch):
    """text_memories (DecayProbe around the scan functions) gives, per layer, 1/(1 - mean alpha) of the decays the
    model applies on the probe windows, the input's share included: against a float64 recomputation of alpha from
    hooks on the projections that produce the decay inputs (Mamba-2: in_proj's dt columns; GDN: in_proj_a; KDA:
    f_b_proj), with each mixer's own A_log, dt_bias and dt clamp. After training-scale updates the weights alone
    no longer tell the memory, so the trace must see the input's share: it must differ from head_memories."""
    import torch
    import torch.nn.functional as F
    import transformers

    torch.manual_seed(21)
    config = tt.build_config(arch, "tiny", transformers)
    model = tt.build_model(arch, config, transformers).train()
    tt.init_long_memory(model, torch)
    with torch.no_grad():  # give the decay inputs a spread, as training does
        for name, p in model.named_parameters():
            if any(k in name for k in ("in_proj", "f_a_proj", "f_b_proj")):
                p.mul_(10.0)
    corpus = bytes(random.Random(22).randrange(32, 127) for _ in range(3000))
    probe = tt.probe_windows(corpus, torch, torch.device("cpu"), length=700)
    assert probe.shape == (tt.PROBE_WINDOWS, 700)
    assert probe[1].tolist() == list(corpus[1500:2200])

    want, hooks = [], []
    if arch == "kimi_linear":
        for gate in tt.kda_forget_gates(model):
            def kda_hook(mod, inp, out):
                g = out.double() + mod.dt_bias.double()
                rate = torch.exp(mod.A_log.double()).reshape(-1).repeat_interleave(mod.head_dim) * F.softplus(g)
                want.append(torch.exp(-rate).mean(dim=(0, 1)))
            hooks.append(gate.f_b_proj.register_forward_hook(lambda m, i, o, gate=gate: kda_hook(gate, i, o)))
    else:
        for mixer in tt.ssm_decay_modules(model):
            if arch == "qwen3_5":
                def gdn_hook(mod, a):
                    rate = torch.exp(mod.A_log.double()) * F.softplus(a.double() + mod.dt_bias.double())
                    want.append(torch.exp(-rate).mean(dim=(0, 1)))
                hooks.append(mixer.in_proj_a.register_forward_hook(lambda m, i, o, mixer=mixer: gdn_hook(mixer, o)))
            else:
                def mamba_hook(mod, out):
                    dt = F.softplus(out[..., -mod.num_heads:].double() + mod.dt_bias.double())
                    lo, hi = mod.time_step_limit
                    alpha = torch.exp(-torch.exp(mod.A_log.double()) * dt.clamp(min=lo, max=hi))
                    want.append(alpha.mean(dim=(0, 1)))
                hooks.append(mixer.in_proj.register_forward_hook(lambda m, i, o, mixer=mixer: mamba_hook(mixer, o)))
    got = tt.text_memories(model, probe, arch, torch, amp=False)
    for h in hooks:
        h.remove()
    assert len(got) == len(want) > 0
    # KDA's gate takes softplus as float32 log(1 + exp(x)): at the 10^4-token channels (x near -9) 1 + exp(x)
    # keeps only ~3 significant digits of exp(x), and the decays the model applies (what the probe reads) carry
    # that (measured up to 1.2e-3 of the memory here).
    rel = 3e-3 if arch == "kimi_linear" else 2e-4
    for layer, alpha in zip(got, want):
        assert layer == pytest.approx((1.0 / (1.0 - alpha)).tolist(), rel=rel)
    weights_only = sorted(m for layer in tt.head_memories(model, torch) for m in layer)
    measured = sorted(m for layer in got for m in layer)
    assert len(weights_only) == len(measured)
    assert measured[len(measured) // 2] != pytest.approx(weights_only[len(weights_only) // 2], rel=0.05)
    assert model.training  # text_memories restores the mode


@needs_torch
def test_deterministic_given_the_seed(trained):
    """Two processes with the same seed (the second one's training split in two runs) make the same weights."""
    runs, _, _ = trained
    a, b = runs["mamba2"]["whole"], runs["mamba2"]["split"]
    digest = [hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest() for d in (a, b)]
    assert digest[0] == digest[1]
    losses = [json.loads((d / "train_log.json").read_text())["loss"] for d in (a, b)]
    assert losses[0] == losses[1]


@needs_torch
def test_skips_evaluation_without_pg19(tmp_path):
    train, _ = make_dirs(tmp_path, n_train=1, train_words=1500)
    out = tmp_path / "out"
    r = run_script(["--arch", "qwen3_5", "--preset", "tiny", "--train-dir", train, "--pg19-dir",
                    tmp_path / "missing", "--out", out, "--steps", 2, "--seq-len", 32, "--batch", 2, "--device",
                    "cpu"])
    assert r.returncode == 0, r.stderr[-3000:]
    card = (out / "MODEL_CARD.md").read_text()
    assert "Skipped: the PG-19 test folder" in card and "not found, so only its path was checked" in card
    assert "Measured on text: skipped (" in card
    r = run_script(["--arch", "qwen3_5", "--preset", "tiny", "--train-dir", train, "--pg19-dir", tmp_path / "missing",
                    "--out", out, "--steps", 2])
    assert r.returncode == 2 and "not empty" in r.stderr


@needs_torch
def test_einsum_scan_matches_transformers_scan():
    """Outputs and gradients of the training scan against transformers' reference mamba2_chunk_scan: groups,
    padding to the chunk size, both dt clamps."""
    import torch
    from transformers.models.mamba2 import modeling_mamba2

    ref = modeling_mamba2.mamba2_chunk_scan
    fast = tt.make_einsum_chunk_scan(ref)
    gen = torch.Generator().manual_seed(11)
    shapes = [(2, 100, 4, 8, 2, 16, 16, (0.0, math.inf)), (1, 64, 6, 4, 3, 8, 32, (0.004, 0.5)),
              (3, 37, 2, 8, 1, 32, 64, (0.0, math.inf)), (1, 130, 8, 16, 2, 128, 64, (0.0, 0.1))]
    for b, t, h, p, g, n, cs, lim in shapes:
        ins = [torch.randn(b, t, h, p, generator=gen), torch.randn(b, t, h, generator=gen) - 1,
               -torch.exp(torch.randn(h, generator=gen)), torch.randn(b, t, g, n, generator=gen),
               torch.randn(b, t, g, n, generator=gen), torch.randn(h, generator=gen), torch.randn(h, generator=gen)]
        for x in ins:
            x.requires_grad_(True)
        w = torch.randn(b, t, h, p, generator=gen)
        results = []
        for f in (ref, fast):
            x, dt, A, B, C, D, dt_bias = ins
            y = f(x, dt, A, B, C, chunk_size=cs, D=D, z=None, dt_bias=dt_bias, dt_softplus=True, dt_limit=lim)
            results.append((y.detach(), torch.autograd.grad((y * w).sum(), ins)))
        (y0, g0), (y1, g1) = results
        assert y1.shape == y0.shape
        assert ((y1 - y0).abs().max() / y0.abs().max()).item() < 1e-5
        for a, c in zip(g0, g1):
            assert ((c - a).abs().max() / a.abs().max()).item() < 1e-5


@needs_torch
@pytest.mark.parametrize("arch", ["mamba2", "nemotron_h"])
def test_einsum_scan_inside_the_model(arch):
    """Under MambaScan the Mamba-2 mixers (Mamba2's and NemotronH's) really call the einsum scan in training, with
    the same loss and gradients as transformers' own path; outside it, transformers' scan is back."""
    import torch
    import transformers
    from transformers.models.mamba2 import modeling_mamba2
    from transformers.models.nemotron_h import modeling_nemotron_h

    torch.manual_seed(3)
    config = tt.build_config(arch, "tiny", transformers)
    if arch == "mamba2":
        config.time_step_limit = (0.004, 0.3)
    model = tt.build_model(arch, config, transformers).train()
    ids = torch.randint(0, 256, (2, 45), generator=torch.Generator().manual_seed(4))
    calls = []
    fast = tt.make_einsum_chunk_scan(modeling_mamba2.mamba2_chunk_scan)

    def counted(*a, **k):
        calls.append(1)
        return fast(*a, **k)

    results = []
    for scan in (None, counted):
        model.zero_grad()
        with tt.MambaScan(scan):
            logits = model(input_ids=ids, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits[0], ids[0].roll(-1))
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    assert len(calls) == tt.layer_pattern(arch, config).count("M")
    assert modeling_mamba2.mamba2_chunk_scan is not counted and modeling_nemotron_h.mamba2_chunk_scan is not counted
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6 * a.abs().max().item())


@needs_torch
def test_gdn_chunk_inside_the_model():
    """Under GatedDeltaChunk(N) the Qwen3.5 model's Gated DeltaNet layers really run transformers' torch delta
    rule with N positions per chunk (sequences not a multiple of N, several chunks), with the loss and gradients of
    its default chunk of 64 to float32 rounding; outside it, transformers' function is back."""
    import torch
    import transformers
    from transformers.models.qwen3_5 import modeling_qwen3_5

    torch.manual_seed(5)
    config = tt.build_config("qwen3_5", "tiny", transformers)
    model = tt.build_model("qwen3_5", config, transformers).train()
    ids = torch.randint(0, 256, (2, 301), generator=torch.Generator().manual_seed(6))
    original = modeling_qwen3_5.torch_chunk_gated_delta_rule
    seen = []

    def spy(*a, **k):
        seen.append(k.get("chunk_size", tt.GDN_DEFAULT_CHUNK))
        return original(*a, **k)

    results = []
    for chunk in (None, 16, 128):
        modeling_qwen3_5.torch_chunk_gated_delta_rule = spy
        try:
            model.zero_grad()
            seen.clear()
            with tt.GatedDeltaChunk(chunk):
                logits = model(input_ids=ids, use_cache=False).logits
                assert (modeling_qwen3_5.torch_chunk_gated_delta_rule is spy) == (chunk is None)
            assert modeling_qwen3_5.torch_chunk_gated_delta_rule is spy
        finally:
            modeling_qwen3_5.torch_chunk_gated_delta_rule = original
        assert seen == [chunk or tt.GDN_DEFAULT_CHUNK] * tt.layer_pattern("qwen3_5", config).count("G")
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), ids.roll(-1, 1).reshape(-1))
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-6)
        for a, b in zip(results[0][1], grads):  # a few 1e-5 of a tensor's largest gradient: summation order
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-4 * a.abs().max().item())


def assert_rule_matches(reference, leaves, chunk, with_state):
    """tt.associative_chunk_gated_delta_rule against transformers' `reference` delta rule on the same leaves
    (q, k, v, g, beta[, initial state]): outputs, final states and every input's gradient, all finite, within
    2e-5 of the reference's largest magnitude."""
    import torch

    results = []
    for rule in (reference, tt.associative_chunk_gated_delta_rule):
        xs = [x.clone().requires_grad_() for x in leaves]
        out, state = rule(*xs[:5], chunk_size=chunk, initial_state=xs[5] if with_state else None,
                          output_final_state=True, use_qk_l2norm_in_kernel=True)
        (out.pow(2).sum() + state.sin().sum()).backward()
        results.append([out.detach(), state.detach()] + [x.grad for x in xs])
    for ref, got in zip(*results):
        assert got.shape == ref.shape and torch.isfinite(got).all()
        assert (got - ref).abs().max() <= 2e-5 * ref.abs().max(), (got - ref).abs().max() / ref.abs().max()


@needs_torch
@pytest.mark.parametrize("length,chunk,with_state", [(301, 16, True), (64, 64, False), (1000, 64, True), (37, 64, False)])
def test_associative_gdn_scan_matches_transformers(length, chunk, with_state):
    """associative_chunk_gated_delta_rule against transformers' torch_chunk_gated_delta_rule on fresh random
    inputs (float64 in, both compute in float32): outputs, final states and the gradients of every input to float32
    rounding, for one chunk, several, a length that is not a multiple of the chunk and one shorter than it."""
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5

    gen = torch.Generator().manual_seed(1000 + length + chunk)
    b, h, dk, dv = 2, 3, 32, 16

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    leaves = [rand(b, length, h, dk), rand(b, length, h, dk), rand(b, length, h, dv),
              -0.2 * torch.rand(b, length, h, generator=gen, dtype=torch.float64),
              torch.rand(b, length, h, generator=gen, dtype=torch.float64)]
    if with_state:
        leaves.append(rand(b, h, dk, dv))
    assert_rule_matches(modeling_qwen3_5.torch_chunk_gated_delta_rule, leaves, chunk, with_state)


@needs_torch
def test_associative_gdn_scan_inside_the_model():
    """GatedDeltaChunk(N, "associative"): the Qwen3.5 model trains through the associative scan, with the loss and
    gradients of transformers' own loop to float32 rounding (also with a chunk of 128)."""
    import torch
    import transformers

    torch.manual_seed(7)
    config = tt.build_config("qwen3_5", "tiny", transformers)
    model = tt.build_model("qwen3_5", config, transformers).train()
    ids = torch.randint(0, 256, (2, 333), generator=torch.Generator().manual_seed(8))
    calls = []
    original = tt.associative_chunk_gated_delta_rule

    def counted(*a, **k):
        calls.append(k["chunk_size"])
        return original(*a, **k)
    results = []
    for chunk, scan in ((None, "loop"), (64, "associative"), (128, "associative")):
        model.zero_grad()
        tt.associative_chunk_gated_delta_rule = counted
        try:
            with tt.GatedDeltaChunk(chunk, scan):
                logits = model(input_ids=ids, use_cache=False).logits
        finally:
            tt.associative_chunk_gated_delta_rule = original
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), ids.roll(-1, 1).reshape(-1))
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    n_gdn = tt.layer_pattern("qwen3_5", config).count("G")
    assert n_gdn > 0 and calls == [64] * n_gdn + [128] * n_gdn
    # a tensor whose gradient is itself rounding noise (~1e-10, e.g. a 2-element parameter) is held to the largest
    # gradient's scale, every other to its own
    floor = 1e-6 * max(a.abs().max().item() for a in results[0][1])
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-6)
        for a, b in zip(results[0][1], grads):
            assert torch.allclose(a, b, rtol=1e-4, atol=max(1e-4 * a.abs().max().item(), floor))
    with pytest.raises(ValueError, match="GDN scan must be one of"):
        tt.GatedDeltaChunk(64, "parallel")


@needs_torch
@pytest.mark.parametrize("length,chunk,with_state", [(301, 16, True), (64, 64, False), (200, 32, True), (37, 64, False),
                                                     (300, 128, True), (90, 24, False)])
def test_associative_kda_scan_matches_transformers(length, chunk, with_state):
    """The same scan on Kimi Delta Attention (a decay per key channel, g [batch, length, heads, dk]) against
    transformers' chunk_kimi_delta_attention on fresh random inputs: outputs, final states and the gradients of
    every input to float32 rounding, for chunks cut into sub-chunks (16 to 128) and one that is not (24). The
    decays span fast and slow channels (-log alpha from 1e-3 to 3), so that a chunk's cumulative decay (down to
    e^-380) would overflow a product of exponentials: every product formed must stay finite."""
    import torch
    from transformers.models.kimi_linear import modeling_kimi_linear

    gen = torch.Generator().manual_seed(2000 + length + chunk)
    b, h, dk, dv = 2, 2, 32, 16

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    rate = torch.exp(math.log(1e-3) + (math.log(3.0) - math.log(1e-3)) * torch.rand(b, length, h, dk, generator=gen,
                                                                                      dtype=torch.float64))
    leaves = [rand(b, length, h, dk), rand(b, length, h, dk), rand(b, length, h, dv), -rate,
              torch.rand(b, length, h, generator=gen, dtype=torch.float64)]
    if with_state:
        leaves.append(rand(b, h, dk, dv))
    assert_rule_matches(modeling_kimi_linear.chunk_kimi_delta_attention, leaves, chunk, with_state)


@needs_torch
def test_associative_kda_scan_inside_the_model():
    """GatedDeltaChunk(N, "associative", "kimi_linear"): the Kimi-Linear-style model trains through the
    associative scan, with the loss and gradients of transformers' own loop to float32 rounding; outside the
    context transformers' function is back."""
    import torch
    import transformers
    from transformers.models.kimi_linear import modeling_kimi_linear

    torch.manual_seed(9)
    config = tt.build_config("kimi_linear", "tiny", transformers)
    model = tt.build_model("kimi_linear", config, transformers).train()
    tt.init_long_memory(model, torch)
    ids = torch.randint(0, 256, (2, 150), generator=torch.Generator().manual_seed(10))
    original = modeling_kimi_linear.chunk_kimi_delta_attention
    results = []
    for chunk, scan in ((None, "loop"), (32, "associative")):
        model.zero_grad()
        with tt.GatedDeltaChunk(chunk, scan, "kimi_linear"):
            assert (modeling_kimi_linear.chunk_kimi_delta_attention is original) == (scan == "loop")
            logits = model(input_ids=ids, use_cache=False).logits
        assert modeling_kimi_linear.chunk_kimi_delta_attention is original
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), ids.roll(-1, 1).reshape(-1))
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    floor = 1e-6 * max(a.abs().max().item() for a in results[0][1])
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, rtol=1e-4, atol=max(1e-4 * a.abs().max().item(), floor))
    with pytest.raises(ValueError, match="no delta-rule layer"):
        tt.GatedDeltaChunk(64, "associative", "mamba2")


@needs_torch
def test_kda_log_uniform_init():
    """--decay-init log-uniform on KDA sets every key channel's memory (A_log 0, dt_bias = softplus^-1 of the
    rate), each head spanning the range; head_memories reads the same values back from the weights, against a
    float64 recomputation of alpha = exp(-exp(A_log) softplus(dt_bias))."""
    import torch
    import transformers

    config = tt.build_config("kimi_linear", "tiny", transformers)
    model = tt.build_model("kimi_linear", config, transformers)
    targets = tt.init_long_memory(model, torch, 10.0, 1e4)
    gates = tt.kda_forget_gates(model)
    assert len(gates) == len(targets) == tt.layer_pattern("kimi_linear", config).count("K") > 0
    mems = tt.head_memories(model, torch)
    for gate, want, got in zip(gates, targets, mems):
        assert len(want) == len(got) == gate.num_heads * gate.head_dim
        rate = torch.exp(gate.A_log.double()).reshape(-1).repeat_interleave(gate.head_dim) * \
            torch.nn.functional.softplus(gate.dt_bias.double())
        alpha = torch.exp(-rate)
        assert torch.allclose(1 / (1 - alpha), torch.tensor(want, dtype=torch.float64), rtol=1e-4)
        assert got == pytest.approx(want, rel=1e-4)
        for h in range(gate.num_heads):  # every head spans (nearly) the whole log-uniform range
            head = want[h * gate.head_dim:(h + 1) * gate.head_dim]
            assert min(head) < 10 * 10.0 ** 0.5 and max(head) > 1e4 / 10 ** 0.5


@needs_torch
def test_trained_checkpoint_runs_in_replayssm(trained, tmp_path):
    """The C++ loader reads the trained checkpoints and matches transformers' log-probabilities."""
    import numpy as np
    import torch
    import transformers

    exe = pathlib.Path(replayssm_binary())
    if not exe.exists():
        pytest.skip(f"{exe} not built")
    runs, _, pg19 = trained
    ids = np.frombuffer(text.strip_book(pg19 / "10146.txt")[:300], np.uint8).astype(np.int32)
    np.save(tmp_path / "ids.npy", ids)
    for arch in ARCHS:
        out = runs[arch]["whole"]
        log = json.loads((out / "train_log.json").read_text())
        info = subprocess.run([str(exe), "info", str(out)], capture_output=True, text=True)
        assert info.returncode == 0 and f"parameters     {log['parameters']}" in info.stdout, info.stderr
        r = subprocess.run([str(exe), "logits", str(out), "--tokens", str(tmp_path / "ids.npy"), "--out",
                            str(tmp_path / f"{arch}.npy")], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32,
                                                                   attn_implementation="eager").eval()
        with torch.no_grad():
            ref = torch.log_softmax(model(input_ids=torch.from_numpy(ids.astype(np.int64))[None],
                                          use_cache=False).logits[0].double(), -1).numpy()
        lp = np.load(tmp_path / f"{arch}.npy")
        assert np.abs(lp - ref).max() / max(1.0, np.abs(ref).max()) < 1e-4


# ---- resumable training, the context schedule, the long-memory initialisation --------------------------------

@needs_torch
@pytest.mark.parametrize("arch", ARCHS)
def test_resumed_training_equals_the_uninterrupted_one(trained, arch):
    runs, _, _ = trained
    r = runs[arch]
    digest = [hashlib.sha256((r[k] / "model.safetensors").read_bytes()).hexdigest() for k in ("whole", "split")]
    assert digest[0] == digest[1]
    logs = [json.loads((r[k] / "train_log.json").read_text()) for k in ("whole", "split")]
    for key in ("loss", "lr", "seq_len", "batch"):
        assert logs[0][key] == logs[1][key], key
    assert logs[0]["eval"] == logs[1]["eval"]
    assert [(x["start_step"], x["end_step"]) for x in logs[1]["runs"]] == [(0, 4), (4, 10)]
    assert "- runs: 2 (resumed from `--resume-dir`)" in (r["split"] / "MODEL_CARD.md").read_text()
    # the save at step 4, and the final save: shards within the size that travels, named by the manifest
    m4 = r["manifest_at_4"]
    assert m4["step"] == 4 and len(m4["log"]["loss"]) == 4
    assert m4["log"]["loss"] == logs[0]["loss"][:4]
    assert sorted(p.name for p in r["resume_dir"].iterdir()) == ["resume.json"]  # finished: the state removed
    final = json.loads((r["resume_dir"] / "resume.json").read_text())
    assert final["step"] == 10 and final["finished"] == {"step": 10, "out": str(r["split"])}
    assert m4["shards"] and all(s["bytes"] <= train_resume.SHARD_BYTES + 2 ** 20 for s in m4["shards"])


@needs_torch
def test_resume_refuses_other_arguments_and_damaged_files(trained, tmp_path):
    runs, train, pg19 = trained
    rd = runs["mamba2"]["resume_dir"]
    out = tmp_path / "o"
    r = run_script(train_args("mamba2", train, pg19, out, "--resume-dir", rd, "--lr", "0.002", "--seed", 8))
    assert r.returncode == 2, r.stderr[-3000:]
    assert "holds a training with other arguments" in r.stderr
    assert "--lr: 0.003 when saved, 0.002 now" in r.stderr and "--seed: 5 when saved, 8 now" in r.stderr
    r = run_script(train_args("mamba2", train, pg19, out, "--resume-dir", rd, "--steps", 12))
    assert r.returncode == 2 and "--steps: 10 when saved, 12 now" in r.stderr, r.stderr[-3000:]
    r = run_script(train_args("mamba2", train, pg19, out, "--resume-dir", rd))
    assert r.returncode == 2 and "holds a finished training (step 10" in r.stderr, r.stderr[-3000:]
    (train / "2009.txt").write_bytes(b"another book\n")  # other training text
    r = run_script(train_args("mamba2", train, pg19, out, "--resume-dir", rd))
    (train / "2009.txt").unlink()
    assert r.returncode == 2 and "training text sha256:" in r.stderr, r.stderr[-3000:]
    r = run_script(train_args("mamba2", train, pg19, out, "--resume-dir", ROOT / "data" / "models" / "x"))
    assert r.returncode == 2 and "is inside data/models" in r.stderr, r.stderr[-3000:]
    r = run_script(train_args("mamba2", train, pg19, out, "--stop-after-steps", 3))
    assert r.returncode == 2 and "--stop-after-steps goes with --resume-dir" in r.stderr
    assert not out.exists()


@needs_torch
def test_resume_refuses_a_damaged_shard(trained, tmp_path):
    import shutil

    runs, train, pg19 = trained
    rd = tmp_path / "resume"
    shutil.copytree(runs["saved_at_4"], rd)
    shard = next(rd.glob("state-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-7])  # cut short, as a broken transfer would
    r = run_script(train_args("mamba2", train, pg19, tmp_path / "o", "--resume-dir", rd))
    assert r.returncode != 0 and "sha256 differs" in r.stderr and shard.name in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "o").exists()


@needs_torch
def test_context_schedule_is_followed(trained):
    runs, _, _ = trained
    log = json.loads((runs["qwen3_5"]["split"] / "train_log.json").read_text())
    expect = [32] * 3 + [64] * 3 + [128] * 4
    assert log["seq_len"] == expect
    assert log["batch"] == [TOKENS_PER_STEP // n for n in expect]
    assert log["tokens_seen"] == 10 * TOKENS_PER_STEP and log["tokens_per_step"] == TOKENS_PER_STEP
    assert log["args"]["segments"] == [[0, 32, 8], [3, 64, 4], [6, 128, 2]]
    card = (runs["qwen3_5"]["whole"] / "MODEL_CARD.md").read_text()
    assert "context schedule (--seq-len-schedule 32:0,64:0.3,128:0.6): 8 x 32 bytes from step 0, 4 x 64 bytes " \
           "from step 3, 2 x 128 bytes from step 6" in card
    assert "independent windows of 128 bytes" in card  # the windowed evaluation uses the final length


def test_context_schedule_parsing():
    assert tt.parse_seq_len_schedule("1024:0,4096:0.3,16384:0.6") == [(1024, 0.0), (4096, 0.3), (16384, 0.6)]
    assert tt.schedule_steps([(1024, 0.0), (4096, 0.3), (16384, 0.6)], 1000, 16384) == \
        [(0, 1024, 16), (300, 4096, 4), (600, 16384, 1)]
    for bad, why in (("1024:0.1", "first entry must start at fraction 0"), ("1024:0,512:0", "fractions must increase"),
                     ("1024", "not LENGTH:FRACTION"), ("0:0", "LENGTH must be positive"),
                     ("1024:0,2048:1", "FRACTION in [0, 1)")):
        with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
            tt.parse_seq_len_schedule(bad)
    with pytest.raises(ValueError, match="is not a whole number of 3000-byte sequences"):
        tt.schedule_steps([(1024, 0.0), (3000, 0.5)], 10, 16384)


def test_refit_segments_keeps_fractions_and_never_shortens_the_context():
    planned = [[0, 1024, 32], [9000, 4096, 8], [18000, 16384, 2]]  # 30,000 steps planned
    # fitted to 2,400 steps at step 30: every later length keeps its fraction
    assert tt.refit_segments(planned, 30000, 2400, 30) == [[0, 1024, 32], [720, 4096, 8], [1440, 16384, 2]]
    # fitted at step 1000 from 2,400 up to 3,000: 4096 runs since 720 and keeps its start, 16384 moves to 1800
    assert tt.refit_segments([[0, 1024, 32], [720, 4096, 8], [1440, 16384, 2]], 2400, 3000, 1000) == \
        [[0, 1024, 32], [720, 4096, 8], [1800, 16384, 2]]
    # shrunk at step 1000 so far that 16384's fraction (600) is behind: it starts at the next step
    assert tt.refit_segments([[0, 1024, 32], [720, 4096, 8], [1440, 16384, 2]], 2400, 1000, 1000) == \
        [[0, 1024, 32], [720, 4096, 8], [1000, 16384, 2]]
    # both later fractions behind at step 50: 4096 is overtaken by 16384 and dropped
    assert tt.refit_segments(planned, 30000, 40, 50) == [[0, 1024, 32], [50, 16384, 2]]
    assert tt.refit_segments(planned, 30000, 100, 50) == [[0, 1024, 32], [50, 4096, 8], [60, 16384, 2]]


@needs_torch
def test_minutes_budget_stretches_the_context_schedule(tmp_path):
    """--minutes fits the step count; the curriculum follows the fitted schedule (a run once fitted to a
    tenth of --steps trained at its first length only), and the card's repeat command reproduces it."""
    train, pg19 = make_dirs(tmp_path)
    out = tmp_path / "fitted"
    args = train_args("mamba2", train, pg19, out)
    args[args.index("--steps") + 1] = 100000
    r = run_script(args + ["--minutes", 0.08, "--eval-bytes", 0])
    assert r.returncode == 0, r.stderr[-3000:]
    log = json.loads((out / "train_log.json").read_text())
    steps = log["steps"]
    assert 30 <= steps < 100000 and "schedule set to" in r.stderr
    assert set(log["seq_len"]) == {32, 64, 128}  # every length of the curriculum was trained
    first_long = log["seq_len"].index(128)
    assert abs(first_long - 0.6 * steps) <= 0.1 * steps + 41  # about its fraction of the fitted schedule
    assert log["seq_len"] == sorted(log["seq_len"])  # never back to a shorter context
    card = (out / "MODEL_CARD.md").read_text()
    assert f"--steps {steps}" in card and "--minutes 0" in card
    repeat = card[card.index("--steps " + str(steps)) - 2000:].split("\n")
    line = next(x for x in repeat if f"--steps {steps}" in x)
    sched = line.split("--seq-len-schedule ")[1].split()[0].strip("`")
    parsed = tt.parse_seq_len_schedule(sched)
    assert [tuple(r) for r in tt.schedule_steps(parsed, steps, TOKENS_PER_STEP)] == \
        [tuple(r) for r in log["args"]["segments"]]


@pytest.mark.parametrize("option,message", [
    (["--seq-len-schedule", "64:0,100:0.5", "--tokens-per-step", "256"],
     "--seq-len-schedule 64:0,100:0.5: 256 tokens per step is not a whole number of 100-byte sequences"),
    (["--seq-len-schedule", "64:0", "--seq-len", "64"], "give --seq-len or --seq-len-schedule, not both"),
    (["--tokens-per-step", "256"], "--tokens-per-step goes with --seq-len-schedule"),
    (["--init-memory", "1:100"], "--init-memory must be LO:HI tokens with 1 < LO <= HI"),
    (["--save-every-minutes", "nan"], "--save-every-minutes must be a finite number >= 0"),
    (["--gdn-chunk", "8"], "--gdn-chunk must be 16 to 4096 positions, got 8"),
    (["--gdn-scan", "associative"], "--gdn-scan applies to the delta-rule architectures (qwen3_5, kimi_linear: Gated DeltaNet, KDA) only, not --arch nemotron_h"),
    (["--gdn-scan", "parallel"], "invalid choice: 'parallel'"),
])
def test_rejects_bad_schedule_and_resume_options(tmp_path, option, message):
    train, pg19 = make_dirs(tmp_path, n_train=1, train_words=200)
    r = run_script(["--arch", "nemotron_h", "--train-dir", train, "--pg19-dir", pg19, "--out", tmp_path / "o", *option])
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


@needs_torch
@pytest.mark.parametrize("arch", ARCHS)
def test_long_memory_initialisation_spans_the_documented_range(trained, arch):
    """--decay-init log-uniform: from the saved tensors (10 steps of training move A_log and dt_bias by at most
    ~10 x the learning rate), each head's memory 1/(1 - alpha) with the input's share of dt at 0 is the documented
    quantile of the log-uniform law on [10, 10^4] tokens (init_long_memory), every layer spanning the range."""
    import torch
    from safetensors.torch import load_file

    runs, _, _ = trained
    w = load_file(str(runs[arch]["whole"] / "model.safetensors"))
    layers = sorted({k.rsplit(".", 1)[0] for k in w if k.endswith(".A_log")},
                    key=lambda k: int(k.split("layers.")[1].split(".")[0]))
    assert layers
    mem = []
    for layer in layers:
        a_log, dt_bias = w[layer + ".A_log"].double(), w[layer + ".dt_bias"].double()
        if arch == "kimi_linear":  # KDA: A_log per head [1, 1, H, 1], dt_bias per key channel [H * dk]
            a_log = a_log.reshape(-1).repeat_interleave(dt_bias.numel() // a_log.numel())
        rate = torch.exp(a_log) * torch.nn.functional.softplus(dt_bias)
        mem.append((1 / -torch.expm1(-rate)).tolist())
    target = tt.long_memory_targets(len(layers), len(mem[0]), 10.0, 1e4)
    if arch == "kimi_linear":  # the channels take the quantiles in an interleaved order (test_kda_log_uniform_init)
        mem = [sorted(m) for m in mem]
    for got, want in zip(mem, target):
        for g, t in zip(got, want):
            assert abs(math.log(g / t)) < 0.1, (got, want)
        assert min(got) < 10 ** 1.8 and max(got) > 10 ** 3.2  # every layer spans the range
    flat = sorted(m for layer in mem for m in layer)
    assert 9 < flat[0] and flat[-1] < 1.1e4
    n = len(flat)
    for decade in (1, 2, 3):  # log-uniform: a third of the heads in each decade of [10, 10^4]
        k = sum(10 ** decade <= m < 10 ** (decade + 1) for m in flat)
        assert abs(k - n / 3) <= 1, (decade, k, n)


@needs_torch
def test_add_decays_to_a_card_trained_without_replayssm(trained, tmp_path):
    """A folder trained where no replayssm binary was (a GPU machine): --add-decays measures the spectrum later
    and puts it into the card in place of the note, and into train_log.json."""
    import shutil

    if not have_replayssm():
        pytest.skip(f"{replayssm_binary()} not built")
    runs, _, pg19 = trained
    folder = tmp_path / "m"
    shutil.copytree(runs["nemotron_h"]["whole"], folder)
    (folder / "decays.json").unlink()
    card = (folder / "MODEL_CARD.md").read_text()
    start = card.index("## Decay spectrum")
    end = card.index("## Software")
    (folder / "MODEL_CARD.md").write_text(card[:start] + "## Decay spectrum (how long the heads remember)\n\n"
                                          "Measured on text: skipped (no replayssm binary at `x`).\n\n" + card[end:])
    r = run_script(["--add-decays", folder, "--pg19-dir", pg19, "--decay-length", 900, "--replayssm",
                    replayssm_binary()])
    assert r.returncode == 0, r.stderr[-3000:]
    new = (folder / "MODEL_CARD.md").read_text()
    s = json.loads((folder / "decays.json").read_text())["summary"]
    assert "skipped" not in new and f"**{s['long_memory_heads']} of {s['heads']}**" in new
    assert new[:start] == card[:start] and new[new.index("## Software"):] == card[end:]
    assert json.loads((folder / "train_log.json").read_text())["decays"]["positions_per_book"] == 900
    r = run_script(["--add-decays", tmp_path / "nothing", "--pg19-dir", pg19])
    assert r.returncode == 2 and "MODEL_CARD.md is missing" in r.stderr


def _decays_for_card(memories, channels, rng):
    """A `replayssm info --decays` JSON as the card reads it, for heads of the given memories."""
    heads = [{"layer": i // 4, "value_head": i % 4, "channels": channels, "memory_tokens": float(m),
              "max_channel_memory_tokens": float(m) * (float(rng.uniform(1.5, 4.0)) if channels > 1 else 1.0)}
             for i, m in enumerate(memories)]
    decades = ["[1,10)", "[10,100)", "[100,1K)", "[1K,10K)", "[10K,100K)", "[100K,1M)", ">=1M"]
    counts = [int(sum(10 ** k <= m < 10 ** (k + 1) for m in memories)) for k in range(6)] + [0]
    summary = {"heads": len(memories), "median_memory_tokens": float(np.median(memories)),
               "max_memory_tokens": float(max(memories)), "long_memory_tokens": 1000.0,
               "long_memory_heads": int(sum(m >= 1000 for m in memories)), "decades": decades, "heads_per_decade": counts}
    return {"summary": summary, "heads": heads, "command": "replayssm info M --decays", "positions_per_book": 4096,
            "seconds": 1.0, "books": [{"name": "b.txt", "bits_per_byte": 2.0}], "mean_bits_per_byte": 2.0}


@pytest.mark.parametrize("arch,channels", [("qwen3_5", 1), ("mamba2", 1), ("kimi_linear", 128)])
def test_card_per_channel_line_only_for_channel_decays_and_its_median(arch, channels):
    # The per-channel line is for KDA alone (replayssm info writes max_channel_memory_tokens for every head,
    # equal to the head's memory when a head has one decay), and its median of an even count of heads is
    # the mean of the middle two, as numpy's (the oracle here) and the summary's.
    rng = np.random.default_rng(1203 + channels)
    memories = list(np.exp(rng.uniform(np.log(2.0), np.log(5000.0), size=24)))
    d = _decays_for_card(memories, channels, rng)
    c = {"args": {"arch": arch, "decay_init": "transformers"}, "decays": d}
    lines = tt.decay_section(c)
    per_channel = [x for x in lines if x.startswith("Per key channel")]
    if channels == 1:
        assert per_channel == []
        return
    assert len(per_channel) == 1
    want = float(np.median([h["max_channel_memory_tokens"] for h in d["heads"]]))
    assert f"median {tt._tokens(want)} tokens" in per_channel[0]
    n_long = sum(h["max_channel_memory_tokens"] >= 1000 for h in d["heads"])
    assert f"**{n_long} of 24**" in per_channel[0]


BUNDLED_LONG = sorted(p.name for p in (ROOT / "data" / "models").glob("long_*") if (p / "decays.json").exists())


@pytest.mark.parametrize("name", BUNDLED_LONG)
def test_bundled_cards_state_their_decays_json(name):
    # A bundled card's decay numbers are those of the decays.json beside it (the card is edited by hand
    # after training for paths and notes; its numbers must still be the measured ones).
    folder = ROOT / "data" / "models" / name
    card = (folder / "MODEL_CARD.md").read_text()
    d = json.loads((folder / "decays.json").read_text())
    s = d["summary"]
    assert f"**{s['long_memory_heads']} of {s['heads']}**" in card
    assert f"SSM heads: median {tt._tokens(s['median_memory_tokens'])} tokens, largest " \
           f"{tt._tokens(s['max_memory_tokens'])}" in card
    assert f"mean {d['mean_bits_per_byte']:.4f}" in card
    kda = [h["max_channel_memory_tokens"] for h in d["heads"] if h.get("channels", 1) > 1]
    per_channel = [x for x in card.splitlines() if x.startswith("Per key channel")]
    if not kda:
        assert per_channel == []
    else:
        assert len(per_channel) == 1 and f"holds median {tt._tokens(float(np.median(kda)))} tokens" in per_channel[0]
