"""QA round 24 on `gpuspeed launch` and the graph helpers: explain(), capture(), the launch CLI (CPU unless marked)."""

import torch

from gpuspeed.graph_breaks import explain


class _PrintsInForward(torch.nn.Module):
    """sin, a print (one graph break), cos: two graphs under torch.compile."""

    def forward(self, x):
        y = x.sin()
        print("in forward")
        return y.cos()


# -- explain() on a module compiled in place (nn.Module.compile()) -----------------------------------------------


def test_explain_of_a_module_compiled_in_place_finds_its_graphs_and_the_fullgraph_failure():
    # m.compile() routes m(x) through an inductor-compiled _call_impl: explain() reported 0 graphs and fullgraph=True
    # "compiles" for a forward with a print in it (and compiled real kernels on the way)
    m = _PrintsInForward()
    m.compile()
    compiled_impl = m._compiled_call_impl
    exp = explain(m, torch.randn(4))
    assert (exp.graph_count, exp.break_count, exp.fullgraph_ok) == (2, 1, False)
    assert m._compiled_call_impl is compiled_impl  # the user's compiled module stays compiled


def test_explain_names_the_module_a_torch_compile_wrapper_holds():
    exp = explain(torch.compile(_PrintsInForward()), torch.randn(4), check_fullgraph=False)
    assert exp.function == "_PrintsInForward"  # was "OptimizedModule", torch's wrapper


# -- explain() leaves what the function updates in place as it found it ------------------------------------------


def _adds_one_in_place(x):
    x.add_(1)
    return x * 2


def test_explain_leaves_an_input_the_function_updates_in_place_as_it_was():
    # explain() calls the function once per pass (explain, the recompile count, fullgraph): x came back as x + 3
    x = torch.zeros(4)
    exp = explain(_adds_one_in_place, x)
    assert torch.equal(x, torch.zeros(4))
    assert any("in place" in n for n in exp.notes)


def test_explain_leaves_a_modules_running_statistics_as_they_were():
    bn = torch.nn.BatchNorm1d(4)  # training mode: each call updates running_mean and num_batches_tracked
    before = {k: v.clone() for k, v in bn.state_dict().items()}
    explain(bn, torch.randn(8, 4))
    after = bn.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


# -- explain()'s recompile reasons name the user's callable, not torch's wrapper of it ---------------------------


def test_explain_recompile_reasons_of_a_module_name_the_module_not_torchs_wrapper():
    # torch.compile runs a module (a partial, a callable object) through a wrapper frame of its own: the reason read
    # "inner at external_utils.py:67: tensor 'args[0]' size mismatch ...", a file of torch's
    exp = explain(torch.nn.Linear(4, 4), torch.randn(2, 4), check_fullgraph=False)
    assert exp.recompile_reasons
    assert not any("external_utils" in r for r in exp.recompile_reasons), exp.recompile_reasons
    assert exp.recompile_reasons[0].startswith("Linear")
    assert exp.expected_recompiles == exp.recompiles  # still the input's first new size: expected


# -- explain() keeps torch's warnings about a break off the user's screen: the report gives the reason ------------


def _calls_a_builtin_dynamo_skips(x):
    import zlib

    y = x + 1
    return y * (zlib.adler32(b"gpuspeed qa24") % 7)


def test_explain_prints_no_torch_warning_for_a_break_it_reports():
    # dynamo warned (5 lines, on stderr, in the middle of the CLI's report) what the break's reason already says
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        exp = explain(_calls_a_builtin_dynamo_skips, torch.randn(4), check_fullgraph=False)
    assert exp.break_count == 1 and "adler32" in exp.breaks[0].reason
    assert not [w for w in seen if "torch" in w.filename], [str(w.message)[:80] for w in seen]


# -- `gpuspeed launch --out DIR` where DIR holds another device's launch.json ---------------------------------------


def test_launch_into_a_folder_holding_another_devices_launch_json_says_it_replaces_it(tmp_path):
    # `gpuspeed launch --out results/nvidia-h200` on the CPU replaced the H200's measured file without a word (roofline
    # names it since round 17)
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "nvidia-h200"
    out.mkdir()
    (out / "launch.json").write_text((root / "results" / "nvidia-h200" / "launch.json").read_text())
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="400", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-m", "gpuspeed", "launch", "--ks", "1,2", "--ns", "1000", "--tiny-k", "2",
                           "--variants", "eager", "--budget", "0.01", "--json", "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    json.loads(done.stdout)  # the note goes to stderr: stdout is the JSON alone
    said = " ".join(done.stderr.split())
    assert "holds a launch study measured on NVIDIA H200: this run on" in said, said[-2000:]
    first = said.index("holds a launch study measured on")
    assert "] 1/" not in said[:first], "said before the measuring starts"  # a step line: "[gpuspeed launch ...] 1/N"
