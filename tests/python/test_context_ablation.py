"""experiments/context_ablation.py (issue 11): its chunked streaming with the cache carried ("full") is the
model's own one-shot forward; on a model without attention the attention restriction changes nothing, and on
the hybrids each restriction changes the result (golden models, float32, CPU; skips without torch)."""
import importlib.util
import math

import pytest

from conftest import ROOT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

spec = importlib.util.spec_from_file_location("context_ablation", ROOT / "experiments" / "context_ablation.py")
ablation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablation)


@pytest.mark.parametrize("model", ["qwen3_5_tiny", "nemotron_h_tiny", "mamba2_tiny"])
def test_streaming_rules(model):
    m = transformers.AutoModelForCausalLM.from_pretrained(ROOT / "data" / "models" / model, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(hash(model) % 2**31)
    vocab = m.config.vocab_size
    ids = torch.randint(1, vocab, (1, 301), generator=gen)
    with torch.no_grad():
        logits = m(input_ids=ids[:, :-1], use_cache=False).logits[0].double()
        ref = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")[63:]
        runs = {rule: ablation.book_nll(m, ids, rule, 32, 64, torch) for rule in ablation.RULES}
    assert {c for _, c in runs.values()} == {len(ref)}
    assert runs["full"][0] == pytest.approx(ref.sum().item(), rel=1e-6)
    assert all(math.isfinite(t) for t, _ in runs.values())
    if model == "mamba2_tiny":  # no attention layer: nothing to restrict
        assert runs["attn-local"][0] == runs["full"][0] and runs["both"][0] == runs["ssm-reset"][0]
    else:
        assert runs["attn-local"][0] != pytest.approx(runs["full"][0], rel=1e-9)
    assert runs["ssm-reset"][0] != pytest.approx(runs["full"][0], rel=1e-9)
