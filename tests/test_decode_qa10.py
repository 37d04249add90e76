"""`gpuspeed decode`'s options as a demanding user meets them (QA round 10, CPU): greedy beside the sampling settings
that change nothing runs greedy, --top-k 0 is no top-k, and the progress bar counts the steps that run."""

import json

import pytest
import torch

from gpuspeed.decode.generate import GREEDY, Sampling, sample
from gpuspeed.errors import UserError

from decode_cli_helpers import SMALL, TINY, cli, one_line
from decode_cli_helpers import one_thread  # noqa: F401  (autouse: one torch thread for this module)

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


class _Bar:
    """The command's progress bar as a user sees it: each step's count against the total shown at that moment."""

    def __init__(self, seen):
        from rich.progress import Progress

        self.inner, self.seen = Progress(disable=True), seen

    def __enter__(self):
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    def add_task(self, *a, **kw):
        return self.inner.add_task(*a, **kw)

    def update(self, task, **kw):
        self.inner.update(task, **kw)
        t = self.inner.tasks[0]
        self.seen.append((kw.get("description"), t.completed, t.total))


def _spec(**kw):
    from gpuspeed.decode import study

    base = dict(model="tiny", max_layers=1, variants=["V2"], prompt_len=3, new_tokens=2, device="cpu",
                bench_budget_s=0.05, read_roof_GBps=10.0, compile_backend="eager")
    return study.Spec(**(base | kw))


def test_an_int8_run_leaves_the_callers_spec_as_it_was_and_counts_the_steps_it_runs(monkeypatch):
    """quant.prepare set spec.hf = False on the caller's Spec, and the CLI's bar counted a transformers step that
    never ran (4 steps against a total of 5)."""
    import copy

    from gpuspeed.decode import study

    spec = _spec(quant="int8", profile=False)  # hf=True: the default, as the command line gives it
    before = copy.deepcopy(spec)
    said, totals = [], []
    doc = study.run(spec, progress=said.append, total=totals.append)
    assert spec == before
    assert study.progress_steps(spec) == len(said) == totals[-1] and set(totals) == {len(said)}, (said, totals)
    assert not [s for s in said if "transformers" in s]
    assert not [r for r in doc["rows"] if r["variant"].startswith("HF")]
    assert doc["params"]["hf"] is False and any("no transformers rows" in n for n in doc["notes"])


def test_the_progress_total_is_the_steps_that_run(monkeypatch, capsys):
    """The CLI's total (3 + variants + batches + long prompt + 1 for transformers) counted neither the profiling
    passes nor the three transformers rows, and counted a reference run an fp32 run never makes: this run read 4/5
    at its last step, the default run of one rung (its profile and three transformers rows) 7/5."""
    from gpuspeed import commands

    seen: list = []
    monkeypatch.setattr(commands, "progress_bar", lambda *a, **kw: _Bar(seen))
    rc, cap = cli(FAST + ["--batches", "2", "--json"], capsys)
    assert rc == 0, cap.err
    steps = [(d, done, total) for d, done, total in seen if d not in (None, "done")]
    assert [d for d, _, _ in steps] == ["loading model", "read ceiling", "tiny_fp32 V2", "tiny_fp32 batch 2"], seen
    assert all(done <= total for _, done, total in seen), seen
    assert steps[-1][1] == steps[-1][2] == 4 and seen[0][2] == 4, seen  # the first total shown was already right


def test_progress_steps_count_profiles_transformers_rows_and_the_reference():
    """What the first total counts before a run (a run of --variants V2 said 7 steps: loading, read ceiling, V2,
    three transformers rows, V2's profile; the CLI's total was 5)."""
    from gpuspeed.decode import study

    assert study.progress_steps(_spec()) == 7
    assert study.progress_steps(_spec(profile=False, hf=False)) == 3
    assert study.progress_steps(_spec(dtype="bf16")) == 8  # + the fp32 reference run
    assert study.progress_steps(_spec(quant="int8")) == 5  # + the bf16 reference, no transformers rows
    assert study.progress_steps(_spec(model="llama-3-8b", max_layers=None)) == 6  # no no-cache row past 5e8 weights
    assert study.progress_steps(_spec(batches=[1, 8, 8], long_prompt=16, hf=False)) == 2 + 2 + 2  # V2, profile, 8, long


@pytest.mark.parametrize("budget", ["inf", "1e400"])
def test_an_infinite_budget_is_one_line_before_any_work(budget, capsys):
    """--budget inf passed the check, every rung failed in bench() ('budget_s must be ... finite') and the run
    ended 'nothing was measured', exit 1, after loading the model and reading the roof."""
    rc, cap = cli(TINY + ["--prompt-len", "3", "--budget", budget], capsys)
    one_line(rc, cap, "--budget is seconds of timing per variant and must be positive and finite, got inf")


@pytest.mark.parametrize("model", ["", "  "])
def test_an_empty_model_is_refused_as_no_model(model, capsys):
    """--model "$MODEL" with MODEL unset read the current folder: '.: no config.json (not a Hugging Face model
    folder)'."""
    rc, cap = cli(SMALL + ["--model", model, "--prompt-len", "3"], capsys)
    one_line(rc, cap, f"no model {model!r}: use tiny")
