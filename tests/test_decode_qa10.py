"""`gpuspeed decode`'s options as a demanding user meets them (QA round 10, CPU): greedy beside the sampling settings
that change nothing runs greedy, --top-k 0 is no top-k, and the progress bar counts the steps that run."""

import json

import pytest
import torch

from gpuspeed.decode.generate import GREEDY, Sampling, sample
from gpuspeed.errors import UserError

from decode_cli_helpers import TINY, cli, one_line

# a given read ceiling: the run skips measuring one (seconds on a CPU), the rows are the same
FAST = TINY + ["--prompt-len", "3", "--read-roof", "10"]


@pytest.mark.parametrize("opt", [["--top-p", "1"], ["--top-k", "1", "--top-p", "1.0"], ["--top-k", "0"]])
def test_greedy_beside_top_k_1_or_0_or_top_p_1_runs_greedy_with_a_note(opt, capsys):
    """The usual spelled-out greedy settings (--temperature 0 --top-p 1) were refused: 'give --temperature > 0'."""
    rc, cap = cli(FAST + ["--temperature", "0", "--json"] + opt, capsys)
    assert rc == 0, cap.err
    doc = json.loads(cap.out)
    assert doc["params"]["sampling"] == {"temperature": 0.0, "top_k": None, "top_p": None, "seed": 0}
    note = [n for n in doc["notes"] if "greedy" in n and opt[0] in n]
    assert len(note) == 1 and len(note[0].splitlines()) == 1, doc["notes"]
    assert "ms_per_token" in doc["rows"][0], doc["rows"]


@pytest.mark.parametrize("top_k,top_p,says", [(5, None, "--top-k 5 shapes sampling"),
                                              (None, 0.9, "--top-p 0.9 shapes sampling"),
                                              (1, 0.5, "--top-p 0.5 shapes sampling"),
                                              (3, 0.9, "--top-k 3 and --top-p 0.9 shape sampling")])
def test_greedy_beside_settings_it_would_ignore_is_still_refused(top_k, top_p, says):
    with pytest.raises(UserError, match="give --temperature > 0") as e:
        Sampling.from_options(0.0, top_k, top_p, seed=3)
    assert says in str(e.value)


def test_what_changes_nothing_under_greedy_is_greedy_itself():
    for top_k, top_p in [(None, None), (1, None), (0, None), (None, 1.0), (0, 1.0), (1, 1)]:
        s, note = Sampling.from_options(0.0, top_k, top_p, seed=0)
        assert s == GREEDY, (top_k, top_p, s)
        assert (note is None) == (top_k is None and top_p is None), (top_k, top_p, note)
    s, note = Sampling.from_options(0.7, 40, 0.95, seed=4)  # sampling: kept as given, no note
    assert (s.temperature, s.top_k, s.top_p, s.seed, note) == (0.7, 40, 0.95, 4, None)


def test_top_k_0_is_no_top_k_as_in_transformers(capsys):
    """--temperature 1 --top-k 0 (transformers' and llama.cpp's 'no top-k') was refused: 'top-k must be >= 1'."""
    s = Sampling(temperature=1.0, top_k=0, seed=1)
    assert s.top_k is None
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(torch.seed() % 2**31))
    draws = [sample(logits, x, torch.Generator().manual_seed(7)) for x in (s, Sampling(temperature=1.0, seed=1))]
    assert torch.equal(draws[0], draws[1])
    with pytest.raises(UserError, match="top-k must be >= 1, or 0 for none"):
        Sampling(temperature=1.0, top_k=-1)
    rc, cap = cli(TINY + ["--prompt-len", "3", "--temperature", "1", "--top-k", "-2"], capsys)
    one_line(rc, cap, "top-k must be >= 1, or 0 for none, got -2")
