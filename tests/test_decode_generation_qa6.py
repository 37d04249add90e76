"""Generation semantics of gpuspeed.decode on the CPU: sampling against a reference and transformers' warpers
(empirical frequencies, chi-square bounds that reject a wrong distribution), seeded replays, EOS stops in a batch,
and what tokens/s counts."""

import pytest
import torch

from gpuspeed.decode import model as M, study, variants as V
from gpuspeed.decode.generate import Sampling, generate, sample

MICRO = dict(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=96)
DRAWS = 40000


def micro(seed=2):
    # tiny's shapes shrunk: at seed 2 its greedy rows change token every step (the 1B's micro repeats one token)
    return M.build(M.named_config("tiny", **MICRO), seed=seed)


def prompt_for(m, b=2, p=5, seed=2):
    return torch.randint(0, m.args.vocab_size, (b, p), generator=torch.Generator().manual_seed(seed))


def reference(logits: torch.Tensor, t: float, k=None, p=None) -> torch.Tensor:
    """The distribution written out: softmax(logits / t), the top k (ties with the k-th kept), then the smallest
    most-likely-first prefix whose mass reaches p (ties by index), renormalized; float64."""
    x = logits.double() / t
    if k is not None and k < x.numel():
        x = x.masked_fill(x < torch.topk(x, k).values[-1], float("-inf"))
    if p is not None and p < 1:
        pr = x.softmax(-1)
        srt, idx = pr.sort(descending=True, stable=True)
        keep = torch.zeros_like(pr, dtype=torch.bool)
        keep[idx] = (srt.cumsum(0) - srt) < p  # the mass before the token has not reached p yet
        x = x.masked_fill(~keep, float("-inf"))
    return x.softmax(-1)


def frequencies(logits: torch.Tensor, s: Sampling, n=DRAWS) -> torch.Tensor:
    tokens = sample(logits[None].expand(n, -1).contiguous(), s, s.generator("cpu"))
    return torch.bincount(tokens, minlength=logits.numel()).double()


def chi2(counts: torch.Tensor, expected_p: torch.Tensor) -> float:
    """Pearson's statistic over the tokens the distribution can give; a token it cannot give drawn even once: inf."""
    n = counts.sum()
    if (counts[expected_p == 0] > 0).any():
        return float("inf")
    e = n * expected_p[expected_p > 0]
    return float(((counts[expected_p > 0] - e) ** 2 / e).sum())


def bound(expected_p: torch.Tensor) -> float:
    df = max(1, int((expected_p > 0).sum()) - 1)
    return df + 6 * (2 * df) ** 0.5 + 6  # ~5 sigma of chi-square(df): a seeded test that is not flaky


def assert_follows(logits, s: Sampling, want: torch.Tensor, wrong: torch.Tensor | None = None):
    counts = frequencies(logits, s)
    assert chi2(counts, want) < bound(want), (counts / counts.sum(), want)
    if wrong is not None:  # the same counts reject a distribution that differs: the bound is not vacuous
        assert chi2(counts, wrong) > bound(wrong), (counts / counts.sum(), wrong)


def transformers_warped(logits, t, k=None, p=None) -> torch.Tensor:
    tr = pytest.importorskip("transformers.generation.logits_process")
    x = logits[None].float()
    x = tr.TemperatureLogitsWarper(t)(None, x)
    if k is not None:
        x = tr.TopKLogitsWarper(k)(None, x)
    if p is not None:
        x = tr.TopPLogitsWarper(p)(None, x)
    return x.softmax(-1)[0].double()


HALVES = torch.log(torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625]))  # cumulative 0.5, 0.75, 0.875: exact in float


@pytest.mark.parametrize("top_p,kept", [(0.5, 1), (0.75, 2), (0.8, 3), (0.875, 3), (0.9, 4)])
def test_top_p_keeps_the_smallest_set_whose_mass_reaches_it_as_transformers_does(top_p, kept):
    """At top_p equal to a prefix's mass that prefix is the set (transformers drops the tail of mass <= 1 - top_p);
    the mass before a token reaching top_p used to keep one token more (0.5 kept two tokens, not one)."""
    want = reference(HALVES, 1.0, p=top_p)
    assert int((want > 0).sum()) == kept
    # the same probabilities; which of two tied tokens at the boundary (0.9) stays differs: we keep the lower index
    hf = transformers_warped(HALVES, 1.0, p=top_p)
    assert torch.allclose(want.sort().values, hf.sort().values, atol=1e-6)
    assert_follows(HALVES, Sampling(temperature=1.0, top_p=top_p, seed=3), want, wrong=reference(HALVES, 1.0))


def test_top_p_over_tied_tokens_keeps_the_lowest_indices_and_top_p_one_keeps_all():
    tied = torch.zeros(6)
    want = reference(tied, 1.0, p=0.5)  # three of six equal tokens: the first three (transformers keeps the last three)
    assert want.tolist()[:3] == pytest.approx([1 / 3] * 3) and want[3:].sum() == 0
    assert_follows(tied, Sampling(temperature=1.0, top_p=0.5, seed=4), want, wrong=reference(tied, 1.0, p=0.6))
    logits = torch.tensor([2.0, 1.0, 1.0, 0.0, -1.0])
    assert_follows(logits, Sampling(temperature=1.0, top_p=1.0, seed=5), reference(logits, 1.0),
                   wrong=reference(logits, 1.0, p=0.9))


def test_top_k_keeps_ties_larger_k_is_no_filter_and_top_k_one_is_greedy():
    logits = torch.tensor([3.0, 2.0, 2.0, 1.0, 0.5])
    want = reference(logits, 0.7, k=2)  # the token tied with the 2nd is kept, as TopKLogitsWarper keeps it
    assert int((want > 0).sum()) == 3 and torch.allclose(want, transformers_warped(logits, 0.7, k=2), atol=1e-6)
    assert_follows(logits, Sampling(temperature=0.7, top_k=2, seed=6), want, wrong=reference(logits, 0.7))
    assert_follows(logits, Sampling(temperature=0.7, top_k=50, seed=7), reference(logits, 0.7),
                   wrong=want)
    apart = torch.tensor([3.0, 2.2, 1.8, 1.0, 0.5])
    both = reference(apart, 0.7, k=3, p=0.8)  # top-k first, then top-p over what it kept (transformers' order)
    assert int((both > 0).sum()) == 2 and torch.allclose(both, transformers_warped(apart, 0.7, k=3, p=0.8), atol=1e-6)
    assert_follows(apart, Sampling(temperature=0.7, top_k=3, top_p=0.8, seed=8), both,
                   wrong=reference(apart, 0.7, k=3))
    # top-k 1 is the greedy token, a tie at the top included (it used to draw between the tied tokens)
    tied_top = torch.tensor([[1.0, 4.0, 4.0, 2.0]]).expand(500, -1)
    s = Sampling(temperature=1.0, top_k=1, seed=9)
    assert torch.equal(sample(tied_top, s, s.generator("cpu")), tied_top.argmax(-1))
    assert sample(tied_top, s, s.generator("cpu")).unique().tolist() == [1]


def test_temperature_extremes():
    logits = torch.tensor([3.0, 2.9, 2.0, 1.0])
    cold = Sampling(temperature=1e-4, seed=1)
    assert frequencies(logits, cold).tolist() == [DRAWS, 0, 0, 0]  # 0.1 apart is 1000 at this temperature
    flat = torch.full((4,), 0.25, dtype=torch.float64)
    assert_follows(logits, Sampling(temperature=1e4, seed=2), reference(logits, 1e4),
                   wrong=reference(logits, 1.0))
    assert torch.allclose(reference(logits, 1e4), flat, atol=1e-3)


def test_seeds_replay_and_differ():
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0))
    a, b, c = (Sampling(temperature=1.0, top_p=0.95, seed=seed) for seed in (1, 1, 2))
    assert torch.equal(sample(logits, a, a.generator("cpu")), sample(logits, b, b.generator("cpu")))
    assert not torch.equal(sample(logits, a, a.generator("cpu")), sample(logits, c, c.generator("cpu")))


@pytest.mark.parametrize("name", ["V0", "V2", "V4"])
def test_a_sampled_decode_restarts_from_the_prefill_state_generator_included(name):
    """decode() restarts from the state prefill left, so the study times the warm generation's tokens (and its EOS
    stop). The generator was not part of that state: each timed decode drew other tokens. decode's tokens are
    also a copy: on the CPU they were the engine's buffer, rewritten by the next decode."""
    m = micro()
    prompt = prompt_for(m)
    s = Sampling(temperature=1.0, seed=5)
    e = V.make_engine(name, m, 2, V.max_len_for(5, 10), sampling=s, compile_backend="eager")
    warm = generate(e, prompt, 10)
    first = e.prefill(prompt)
    one = e.decode(first, 9)
    kept = one.clone()
    two = e.decode(first, 9)
    assert torch.equal(one, warm[:, 1:]) and torch.equal(two, warm[:, 1:]), name
    e.decode(torch.tensor([0, 1]), 9)  # another start: other tokens in the engine's buffers
    assert torch.equal(one, kept), name
    other = generate(V.make_engine(name, m, 2, V.max_len_for(5, 10), sampling=Sampling(temperature=1.0, seed=6),
                                   compile_backend="eager"), prompt, 10)
    assert not torch.equal(other, warm)


def _free_run(m, prompt, t):
    return generate(V.make_engine("V2", m, prompt.shape[0], V.max_len_for(prompt.shape[1], t)), prompt, t)


def _eos_pair(free):
    """Two EOS ids: the first ends row 0 at step 2 or later, the second ends row 1 at another step."""
    r0, r1 = free[0].tolist(), free[1].tolist()
    for i in range(2, len(r0)):
        for j in range(1, len(r1)):
            a, b = r0[i], r1[j]
            stop0 = min(r0.index(x) for x in (a, b) if x in r0)
            stop1 = min(r1.index(x) for x in (a, b) if x in r1)
            if a != b and stop0 == i and stop1 == j and i != j and max(i, j) < 6:
                return [a, b], (i, j)
    raise AssertionError(f"no EOS pair in {free}")


def test_eos_in_a_batch_stops_rows_at_their_own_steps_with_several_eos_ids():
    m = micro()
    prompt = prompt_for(m)
    t = 16
    free = _free_run(m, prompt, t)
    eos, stops = _eos_pair(free)
    for name in V.ORDER:
        e = V.make_engine(name, m, 2, V.max_len_for(5, t), eos_ids=eos, check_every=4, compile_backend="eager")
        got = generate(e, prompt, t)
        assert got.shape[1] < t, name  # stopped at a check, not run to the end
        for row, stop in enumerate(stops):
            toks = got[row].tolist()
            assert toks[:stop + 1] == free[row, :stop + 1].tolist(), name  # to its EOS: the free run's
            assert all(x == eos[0] for x in toks[stop + 1:]), name  # after it: EOS, never a generated token
        # the text's tokens: each row's to its EOS (the prefill's first included); the EOS repeated after it are not
        assert study.text_tokens(got, eos) == sum(stops) + 2


def test_eos_first_and_never():
    m = micro()
    prompt = prompt_for(m)
    t = 8
    free = _free_run(m, prompt, t)
    for name in ("V0", "V2", "V5"):
        first = generate(V.make_engine(name, m, 2, V.max_len_for(5, t), eos_ids=free[:, 0].tolist(), check_every=4,
                                       compile_backend="eager"), prompt, t)
        assert (first[:, 1:] == free[0, 0]).all() and torch.equal(first[:, 0], free[:, 0]), name
        assert study.text_tokens(first, free[:, 0].tolist()) == 2  # each row's first token, its EOS
        unseen = [x for x in range(m.args.vocab_size) if x not in free.tolist()[0] + free.tolist()[1]][:2]
        never = generate(V.make_engine(name, m, 2, V.max_len_for(5, t), eos_ids=unseen, check_every=4,
                                       compile_backend="eager"), prompt, t)
        assert torch.equal(never, free), name
        assert study.text_tokens(never, unseen) == 2 * t


def test_tokens_per_s_counts_the_timed_tokens_and_the_row_the_texts_tokens_apart():
    """The timed decodes run on past an EOS (ignore-EOS: every rung times the same work, test_decode_qa16), so tokens/s
    counts every timed token; text_tokens says where the text ended."""
    m = micro()
    prompt = prompt_for(m)
    t = 10
    free = _free_run(m, prompt, t)
    eos, stops = _eos_pair(free)
    spec = study.Spec(model="tiny", new_tokens=t, hf=False, profile=False, agreement=False, bench_budget_s=0.05,
                      compile_backend="eager", device="cpu")
    row, tokens, _ = study.measure_variant("V2", m, spec, prompt, "cpu", eos_ids=eos)
    steps = row["timed_steps"]
    assert steps == tokens.shape[1] - 1 == t - 1  # V2 checks every 16 steps: it ran on, emitting EOS
    assert row["timed_tokens"] == 2 * steps and row["text_tokens"] == sum(stops) + 2 < 2 * t
    assert row["tokens_per_s"] == pytest.approx(row["timed_tokens"] / (row["decode_ms"] / 1e3))


def test_greedy_batch_with_eos_matches_transformers_generate():
    """Two different prompts, greedy, an EOS each row meets at its own step: transformers' generate with the same
    EOS ids stops each row there (and pads); ours agree up to each row's EOS."""
    pytest.importorskip("transformers", reason="transformers not installed")
    from gpuspeed.decode import checkpoints as C

    m = micro()
    prompt = prompt_for(m)
    t = 10
    free = _free_run(m, prompt, t)
    eos, stops = _eos_pair(free)
    hf = C.to_hf(m)
    hf.generation_config.eos_token_id = eos
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=t, do_sample=False,
                         pad_token_id=eos[0])[:, prompt.shape[1]:]
    plain = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=t, do_sample=False,
                        pad_token_id=0, eos_token_id=None)[:, prompt.shape[1]:]
    assert torch.equal(plain, free)  # no EOS: the same greedy tokens, batch 2
    for name in ("V0", "V2", "V4"):
        ours = generate(V.make_engine(name, m, 2, V.max_len_for(5, t), eos_ids=eos, check_every=4,
                                      compile_backend="eager"), prompt, t)
        for row, stop in enumerate(stops):
            assert ours[row, :stop + 1].tolist() == theirs[row, :stop + 1].tolist(), name
            assert int(theirs[row, stop]) in eos


def test_a_partial_summary_leaves_tokens_identical_open_until_the_rows_are_compared():
    # a results file written mid-run (rows timed, V0's comparison not yet made) said tokens_identical False
    spec = study.Spec(model="tiny", hf=False)
    row = {"ms_per_token": 1.0, "weight_GBps": 1.0, "tokens_per_s": 1e3, "batch": 1}
    rows = [dict(row, variant="V4"), dict(row, variant="V0")]
    assert study.summarize("tiny_fp32", rows, [], [], spec)["tiny_fp32_tokens_identical"] is None
    compared = [dict(r, tokens_identical_to_V0=True) for r in rows]
    assert study.summarize("tiny_fp32", compared, [], [], spec)["tiny_fp32_tokens_identical"] is True
    compared[0]["tokens_identical_to_V0"] = False
    assert study.summarize("tiny_fp32", compared, [], [], spec)["tiny_fp32_tokens_identical"] is False
