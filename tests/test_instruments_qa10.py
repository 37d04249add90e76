"""QA round 10 on the instruments: capture(), explain(), profile(), launch (CPU unless marked gpu)."""

import json
import textwrap

import pytest
import torch

from gpuspeed.cli import main
from gpuspeed.errors import UserError
from gpuspeed.profiling import profile


# -- profile: an nn.Module from a library has its ops -----------------------------------------------


def test_profile_of_a_library_module_lists_its_ops():
    # torch.nn.Linear's forward is all library code: no user frame to place its ops at, but they are its ops
    lin = torch.nn.Linear(16, 16)
    res = profile(lin, torch.randn(4, 16), steps=2, warmup=0, device="cpu", hotspots=False)
    ops = {o["name"]: o for o in res.findings["top_ops"]}
    assert "aten::linear" in ops, res.findings["top_ops"]
    assert ops["aten::linear"]["calls_per_step"] == 1 and ops["aten::linear"]["file"] is None


def test_profile_cli_function_that_is_a_module_prints_its_op_table(tmp_path, capsys):
    p = tmp_path / "nets.py"
    p.write_text(textwrap.dedent("""\
        import torch
        seq = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        """))
    assert main(["profile", "--device", "cpu", "--no-hotspots", "--json", "--function", f"{p}:seq",
                 "-i", "input=float32[4,8]"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = {o["name"] for o in doc["findings"]["top_ops"]}
    assert {"aten::linear", "aten::relu"} <= names, names


class _TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        h = torch.relu(h)
        return self.b(h)


def test_profile_places_a_submodule_call_at_its_line():
    # the trace names `self.a(x)` 'nn.Module: Linear_0', which matched no recorded call: placed at forward's def line
    net = _TwoLayers()
    res = profile(net, torch.randn(4, 8), steps=1, warmup=0, device="cpu", hotspots=False)
    first = _TwoLayers.forward.__code__.co_firstlineno
    lines = sorted(o["line"] for o in res.findings["top_ops"] if o["name"] == "aten::linear")
    assert lines == [first + 1, first + 3], res.findings["top_ops"]


# -- launch: K and N are whole numbers, each once ----------------------------------------------------


@pytest.mark.parametrize("kw, match", [
    ({"ks": [1, 2.5]}, r"--ks takes whole numbers, got 2\.5"),
    ({"ks": [4, 4]}, r"--ks names 4 more than once"),
    ({"ks": [1.0, 1]}, r"--ks names 1 more than once"),
    ({"ns": [1000, 1500.5]}, r"--ns takes whole numbers"),
    ({"ns": [1000, 1e3]}, r"--ns names 1000 more than once"),
    ({"ks": [True, 2]}, r"--ks takes whole numbers, got True"),
    ({"ks": ["8"]}, r"--ks takes whole numbers, got '8'"),
    ({"tiny_k": 5.5}, r"--tiny-k takes whole numbers, got 5\.5"),
    ({"chain_k": float("nan")}, r"--chain-k takes whole numbers"),
    ({"variants": ["eager", "eager"]}, r"--variants names eager more than once"),
])
def test_run_launch_refuses_fractional_and_repeated_values(kw, match):
    from gpuspeed import launch

    args = dict(device="cpu", ks=[1, 2], ns=[1000], tiny_k=5, chain_k=2, variants=["eager"], budget_s=0.01) | kw
    with pytest.raises(UserError, match=match):
        launch.run_launch(**args)
    with pytest.raises(UserError, match=match):  # the check the CLI makes before its progress bar, too
        launch.check_params(args["ks"], args["ns"], args["chain_k"], args["tiny_k"], 0.01, args["variants"])


def test_run_launch_takes_whole_floats_and_numpy_values():
    import numpy as np

    from gpuspeed import launch

    doc = launch.run_launch(device="cpu", ks=np.array([1, 2]), ns=[1e3], tiny_k=5.0, chain_k=2, variants=["eager"],
                            budget_s=0.01)
    assert doc["params"]["ks"] == [1, 2] and doc["params"]["ns"] == [1000] and doc["params"]["tiny_k"] == 5
    assert all(type(v) is int for v in doc["params"]["ks"] + doc["params"]["ns"])


# -- explain: the reset of dynamo's caches is said ----------------------------------------------------


def _compiled_elsewhere(x):
    return torch.sin(x) * 2


def _with_a_break(x):
    y = x.cos()
    print("a print breaks the graph")
    return y + 1


def test_explain_names_the_functions_its_reset_makes_recompile(capsys):
    from gpuspeed.graph_breaks import explain

    compiles = [0]

    def counting(gm, example_inputs):
        compiles[0] += 1
        return gm.forward

    torch._dynamo.reset()
    # nothing compiled before it: no note (decode's V3 check runs explain() on its step with nothing else compiled)
    clean = explain(_with_a_break, torch.randn(4), check_fullgraph=False)
    assert clean.break_count == 1 and not [n for n in clean.notes if "reset" in n], clean.notes
    capsys.readouterr()
    g = torch.compile(_compiled_elsewhere, backend=counting)
    x = torch.randn(8)
    g(x)
    g(x)
    assert compiles[0] == 1
    exp = explain(_with_a_break, torch.randn(4), check_fullgraph=False)
    assert exp.break_count == 1
    g(x)
    assert compiles[0] == 2  # what the note is for: explain()'s reset made the user's function compile again
    (note,) = [n for n in exp.notes if "reset" in n]
    assert "_compiled_elsewhere at test_instruments_qa10.py:" in note and "1 function(s)" in note
    assert "note: explain() reset" in str(exp)


# -- capture: a function that updates its inputs in place ---------------------------------------------


def _bump(x):
    x.add_(1)
    return x * 2


def test_capture_on_the_cpu_runs_an_in_place_function_once_per_call():
    import warnings

    from gpuspeed import graphs

    x0 = torch.randn(16)
    x = x0.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = graphs.capture(_bump, x, device="cpu")
    assert torch.equal(x, x0)  # the eager fallback runs nothing at capture time: no warm-up
    torch.testing.assert_close(g(x), (x0 + 1) * 2)
    torch.testing.assert_close(x, x0 + 1)  # as one eager call leaves it
    torch.testing.assert_close(g(x), (x0 + 2) * 2)


@pytest.mark.gpu
def test_capture_own_inputs_first_call_replays_once_on_the_callers_tensor():
    from gpuspeed import graphs

    x0 = torch.randn(64, device="cuda")
    # a first call that captures: it replayed on the private buffer as the warm-ups left it, (x0 + 4) * 2
    x = x0.clone()
    g = graphs.capture(_bump, own_inputs=True)
    torch.testing.assert_close(g(x), (x0 + 1) * 2)
    torch.testing.assert_close(g.static_inputs[0], x0 + 1)
    assert torch.equal(x, x0)  # own_inputs: the tensor passed is never updated
    torch.testing.assert_close(g(x), (x0 + 1) * 2)  # copied in again at every call
    # capture(fn, x) then g(x): the same result
    g2 = graphs.capture(_bump, x, own_inputs=True)
    torch.testing.assert_close(g2(x), (x0 + 1) * 2)
    # an expand()ed input gets a private dense buffer without own_inputs: its first call too
    row = torch.randn(1, 8, device="cuda")
    g3 = graphs.capture(lambda t: t * 3 + t.sum())
    wide = row.expand(4, 8)
    torch.testing.assert_close(g3(wide), wide * 3 + wide.sum())


@pytest.mark.gpu
def test_capture_default_in_place_state_is_as_the_docstring_says():
    from gpuspeed import graphs

    x0 = torch.randn(64, device="cuda")
    x = x0.clone()
    g = graphs.capture(_bump, x, warmup=2)
    torch.testing.assert_close(x, x0 + 2)  # the warm-up calls ran on x itself; recording ran nothing
    torch.testing.assert_close(g(x), (x0 + 3) * 2)
    torch.testing.assert_close(x, x0 + 3)


# -- capture: a NumPy argument's key -------------------------------------------------------------------


def test_signature_hashes_a_numpy_array_without_copying_it():
    import tracemalloc

    import numpy as np

    from gpuspeed import graphs

    a = np.random.default_rng().standard_normal(1 << 20)  # 8 MB
    graphs.signature((a,))
    tracemalloc.start()
    try:
        key = graphs.signature((a,))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < (1 << 20), peak  # tobytes() made an 8 MB copy of it on every call
    # still keyed by every byte: an in-place change anywhere is another graph, equal contents are one
    b = a.copy()
    assert graphs.signature((b,)) == key
    b[len(b) // 2] = np.nextafter(b[len(b) // 2], np.inf)
    assert graphs.signature((b,)) != key
    m = np.random.default_rng().standard_normal((64, 48))
    assert graphs.signature((np.asfortranarray(m),)) == graphs.signature((m,))  # F order: the same C-order bytes
    assert graphs.signature((m[:, ::2],)) == graphs.signature((np.ascontiguousarray(m[:, ::2]),))
    assert graphs.signature((m[:, ::2],)) != graphs.signature((np.ascontiguousarray(m[:, 1::2]),))
    days = np.arange(3).astype("datetime64[D]")  # the buffer protocol refuses datetime64: hashed from its bytes
    assert graphs.signature((days,)) == graphs.signature((days.copy(),)) != graphs.signature((days + 1,))
