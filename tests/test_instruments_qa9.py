"""QA round 9 on the instruments: capture(), explain(), profile(), roofline, launch, doctor (CPU unless marked gpu)."""

import warnings

import pytest
import torch

from gpuspeed import graphs
from gpuspeed.errors import UserError


def _scaled(x, *, scale=2.0, bias=None):
    y = x * scale
    return y if bias is None else y + bias


def _eager(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return graphs.capture(fn, *args, device="cpu", **kw)


def test_capture_takes_keyword_arguments_eagerly():
    x, b = torch.randn(5), torch.randn(5)
    g = _eager(_scaled, x, kwargs={"scale": 3.0, "bias": b})
    torch.testing.assert_close(g(x, scale=3.0, bias=b), x * 3.0 + b)
    torch.testing.assert_close(g(x, bias=b, scale=0.5), x * 0.5 + b)
    with pytest.raises(UserError, match="kwargs"):
        _eager(_scaled, x, kwargs=[("scale", 3.0)])


def test_signature_keys_keyword_arguments():
    x, b = torch.randn(4), torch.randn(4)
    s = graphs.signature
    assert s((x,), {"scale": 2.0}) != s((x,), {"scale": 3.0})  # a changed keyword value re-captures
    assert s((x,), {"scale": 2.0}) != s((x,))
    assert s((x,), {"bias": b, "scale": 2.0}) == s((x,), {"scale": 2.0, "bias": b})  # order does not matter
    assert s((x,), {"bias": b}) != s((x,), {"bias": torch.randn(8)})
    assert s((x,), {}) == s((x,))


@pytest.mark.gpu
def test_capture_replays_keyword_tensors_and_recaptures_keyword_values():
    x, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    g = graphs.capture(_scaled, x, kwargs={"scale": 3.0, "bias": b}, clone=True)
    for _ in range(3):
        x2, b2 = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
        torch.testing.assert_close(g(x2, scale=3.0, bias=b2), x2 * 3.0 + b2)
    assert g.captures == 1
    x3, b3 = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    torch.testing.assert_close(g(x3, scale=0.5, bias=b3), x3 * 0.5 + b3)  # another value: a new graph
    assert g.captures == 2 and g.static_kwargs["scale"] == 0.5


def test_profile_refuses_a_one_pass_iterator_argument():
    from gpuspeed.profiling import profile

    def total(xs):
        return sum(float(x.sum()) for x in xs)

    with pytest.raises(UserError, match="one-pass iterator.*list or a tuple"):
        profile(total, (torch.randn(10) for _ in range(3)), steps=2, hotspots=False, device="cpu")
    with pytest.raises(UserError, match="keyword argument 'xs'"):
        profile(total, kwargs={"xs": iter([torch.randn(4)])}, steps=1, hotspots=False, device="cpu")
    r = profile(total, [torch.randn(10) for _ in range(3)], steps=1, hotspots=False, device="cpu")  # a list is fine
    assert r.params["calls"] == 3


def test_signature_keys_how_tensor_arguments_overlap():
    s = graphs.signature
    x = torch.randn(9)
    apart = (torch.randn(8), torch.randn(8))
    # static buffers x[:-1], x[1:] overlap: independent tensors copied into them would overwrite each other
    assert s((x[:-1], x[1:])) != s(apart)
    y = torch.randn(9)
    assert s((x[:-1], x[1:])) == s((y[:-1], y[1:]))  # the same overlap elsewhere is the same graph
    assert s((x[:-1], x[1:])) != s((x[:-2], x[1:-1]))
    q = torch.randn(2, 8)
    assert s((q[0], q[1])) == s(apart)  # views of one buffer that do not overlap need no graph of their own
    assert s((x, x)) != s((x, y))


@pytest.mark.gpu
def test_capture_of_overlapping_views_stays_right_for_independent_inputs():
    def stencil(a, b):
        return a * 2 + b

    x = torch.randn(1025, device="cuda")
    g = graphs.capture(stencil, x[:-1], x[1:], clone=True)
    for _ in range(3):
        a, b = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
        torch.testing.assert_close(g(a, b), a * 2 + b)
    z = torch.randn(1025, device="cuda")
    torch.testing.assert_close(g(z[:-1], z[1:]), z[:-1] * 2 + z[1:])


def test_copy_in_reads_every_source_before_a_buffer_it_shares_is_written():
    # the copy step of a replay, run on host tensors: a graph captured as g(a, b) and called as g(b, a) (the swap of a
    # double buffer) must see (b, a), not (b, b)
    a, b = torch.randn(64), torch.randn(64)
    want_a, want_b = b.clone(), a.clone()
    graphs._copy_pairs([(a, b), (b, a)])
    assert torch.equal(a, want_a) and torch.equal(b, want_b)
    x = torch.randn(65)
    shifted = x[1:].clone()
    graphs._copy_pairs([(x[:-1], x[1:])])  # a source overlapping its own buffer (torch's copy_ refuses it)
    assert torch.equal(x[:-1], shifted)


@pytest.mark.gpu
def test_capture_swapped_double_buffer_and_expanded_input():
    def step(u, v):
        return u * 0.5 + v

    a, b = torch.randn(256, device="cuda"), torch.randn(256, device="cuda")
    g = graphs.capture(step, a, b, clone=True)
    want = b * 0.5 + a
    torch.testing.assert_close(g(b, a), want)  # same signature, the static buffers swapped
    row = torch.randn(1, 32, device="cuda")
    g2 = graphs.capture(lambda t: t * 2, row.expand(8, 32), clone=True)
    y = torch.randn(8, 32, device="cuda")
    torch.testing.assert_close(g2(y), y * 2)  # an expand()ed example: its buffer takes a dense tensor copied in
    torch.testing.assert_close(g2(row.expand(8, 32)), row.expand(8, 32) * 2)


def _launch_doc() -> dict:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent.parent / "results" / "nvidia-h200" / "launch.json").read_text())


def test_launch_artifacts_record_a_failed_plot_in_the_json_and_leave_no_temp_file(tmp_path):
    import json

    from gpuspeed import launch

    doc = _launch_doc()
    (tmp_path / "launch.png").mkdir()  # the plot cannot take its name: it fails after the figure is drawn
    paths = launch.write_artifacts(doc, tmp_path)
    written = json.loads((tmp_path / "launch.json").read_text())
    assert any(n.startswith("plot failed") for n in written["notes"])  # the file says why there is no plot
    assert (tmp_path / "launch.md").is_file() and all(p.is_file() for p in paths)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["launch.json", "launch.md", "launch.png"]  # no temp left


def _helper_module(tmp_path):
    import importlib.util

    (tmp_path / "qa9_helper.py").write_text(
        "import functools\n\n"
        "def noisy(y):\n"
        "    print('in helper')  # the break itself\n"
        "    return y + 1\n\n"
        "def logged(fn):\n"
        "    @functools.wraps(fn)\n"
        "    def wrapper(*a, **k):\n"
        "        return fn(*a, **k)\n"
        "    return wrapper\n")
    spec = importlib.util.spec_from_file_location("qa9_helper", tmp_path / "qa9_helper.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_explain_places_breaks_in_the_callers_file_for_modules_partials_and_decorated_functions(tmp_path):
    import functools

    from gpuspeed.graph_breaks import explain

    helper = _helper_module(tmp_path)

    def step(x):
        y = x * 2
        return helper.noisy(y)  # CALL-SITE

    class Step(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            return helper.noisy(y)  # CALL-SITE-M

    import inspect

    def line(fn, marker):
        src, start = inspect.getsourcelines(fn)
        return start + next(i for i, t in enumerate(src) if marker in t)

    where = f"test_instruments_qa9.py:{line(step, 'CALL-SITE')}"
    for fn in (step, functools.partial(step), helper.logged(step)):
        exp = explain(fn, torch.randn(4), variants=[], check_fullgraph=False)
        assert [b.where() for b in exp.breaks] == [where], fn
    exp = explain(Step(), torch.randn(4), variants=[], check_fullgraph=False)
    assert [b.where() for b in exp.breaks] == [f"test_instruments_qa9.py:{line(Step.forward, 'CALL-SITE-M')}"]


def test_profile_refuses_a_misspelled_line_backend_and_kwargs_that_are_not_a_dict():
    from gpuspeed.profiling import profile

    x = torch.randn(16)
    with pytest.raises(UserError, match="line_backend 'setrace'.*settrace"):
        profile(torch.sin, x, steps=1, warmup=0, line_backend="setrace", device="cpu")
    with pytest.raises(UserError, match="kwargs= takes a dict"):
        profile(torch.sin, x, steps=1, warmup=0, kwargs=[("out", None)], hotspots=False, device="cpu")


def test_a_cpu_launch_run_says_which_clock_timed_it():
    from gpuspeed import launch

    doc = launch.run_launch(device="cpu", ks=[1, 2], ns=[1000], tiny_k=5, chain_k=2, variants=["eager"],
                            budget_s=0.01)
    text = " ".join(doc["notes"])
    assert "CUDA events" not in text and "perf_counter" in text  # a CPU run has no events to time with
    assert doc["study"] == "launch" and doc["schema"] == 1 and doc["device"]["kind"] == "cpu"
