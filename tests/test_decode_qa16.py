"""QA round 16: `gpuspeed decode` on the CPU: a model whose EOS comes first (every rung must time the same work), a
failing tensor-parallel rank (the run ends at once, in one line), and a demanding user's flags and checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from decode_cli_helpers import SMALL, cli, random_hf_llama
from test_decode_qa15 import BASE, save_tokenizer, words

PROMPT = words(3)


@pytest.fixture
def eos_first(tmp_path):
    """A random Llama folder whose EOS id is the greedy first token after PROMPT: generation ends at once."""
    from gpuspeed.decode import checkpoints, study, variants as V
    from gpuspeed.decode.generate import generate

    d = tmp_path / "eos-first"
    random_hf_llama(BASE).save_pretrained(d)
    save_tokenizer(d)
    ck = checkpoints.load(str(d), device="cpu", dtype=torch.float32)
    prompt, _ = study.make_prompt(study.Spec(model=str(d), prompt=PROMPT, new_tokens=2), ck, "cpu")
    engine = V.make_engine("V2", ck.model, 1, V.max_len_for(prompt.shape[1], 2))
    first = int(generate(engine, prompt, 1)[0, 0])
    for name in ("config.json", "generation_config.json"):
        f = d / name
        if f.exists():
            f.write_text(json.dumps(json.loads(f.read_text()) | {"eos_token_id": first}))
    return d


def test_an_eos_first_times_the_same_steps_on_every_rung_and_the_text_still_stops(eos_first, capsys):
    """The model's first token was its EOS: V0 timed 1 decode step, V2 and V5 16 (their first EOS check), so the
    ladder's ms/token and speedups compared different work, and tokens/s was 0. A benchmark times the same tokens on
    every rung, EOS ignored (llama.cpp's and vLLM's ignore-EOS); the text shown still ends at the EOS."""
    t = 20
    rc, cap = cli(["--model", str(eos_first), "--prompt", PROMPT, *SMALL[2:], "--new-tokens", str(t),
                   "--variants", "V0,V2,V5", "--compile-backend", "eager", "--json"], capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    rows = {r["variant"]: r for r in doc["rows"]}
    assert set(rows) == {"V0", "V2", "V5"}
    for name, r in rows.items():
        assert r["timed_steps"] == t - 1, (name, r["timed_steps"])
        assert r["timed_tokens"] == t - 1, name  # batch 1: a token a step
        assert r["text_tokens"] == 1, name  # the EOS itself: the text ends there
        assert r["tokens_per_s"] == pytest.approx(r["timed_tokens"] / (r["decode_ms"] / 1e3)), name
        assert r["text"] == doc["params"]["texts"][name] and len(r["text"].split()) == 1, r["text"]
    assert doc["summary"]["eos-first_fp32_b1_tokens_per_s"] > 0
    assert not any("different steps" in n for n in doc["notes"]), doc["notes"]
    said = [n for n in doc["notes"] if "EOS" in n]
    assert len(said) == 1 and "1 token" in said[0] and str(t - 1) in said[0], doc["notes"]
