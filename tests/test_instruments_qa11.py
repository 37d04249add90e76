"""QA round 11 on the instruments: profile of users' scripts, launch, roofline, graphs, doctor, bench, results
(CPU unless marked gpu)."""

import textwrap

import torch

from gpuspeed.profiling import hotspots, profile
from gpuspeed.profiling.script import ScriptRunner


# -- profile: the settrace line timer charges a calling line what its callee's lines hold -------------


def _qa11_work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def _qa11_caller(n):
    a = _qa11_work(n)
    return a + 1


def test_settrace_line_that_calls_a_traced_function_holds_the_callees_time():
    """The line calling a timed function was charged the wall time across the call less an estimate of the
    timer's work in there (events x a calibrated cost per event): hundreds of thousands of events times the
    error of that estimate left the line at 0 s, or at two or three times the callee's own lines."""
    w, c = _qa11_work.__code__, _qa11_caller.__code__
    targets = [(w.co_filename, w.co_firstlineno, w.co_name), (c.co_filename, c.co_firstlineno, c.co_name)]
    for _ in range(5):
        lt = hotspots.line_times(targets, _qa11_caller, (60_000,), backend="settrace")
        funcs = {f["function"]: f for f in lt["functions"]}
        callee = funcs["_qa11_work"]["time_s"]
        (call_line,) = [r for r in funcs["_qa11_caller"]["lines"] if r["line"] == c.co_firstlineno + 1]
        assert callee > 0 and 0.95 * callee <= call_line["time_s"] <= 1.2 * callee, (call_line, callee)


def test_a_script_ending_in_sys_exit_main_has_that_line_as_its_hot_line(tmp_path):
    # the usual `if __name__ == "__main__": sys.exit(main())`: the module's hot line was 'import sys'
    p = tmp_path / "tool.py"
    p.write_text(textwrap.dedent("""\
        import sys

        def work(n):
            s = 0
            for i in range(n):
                s += i * i
            return s

        def main():
            work(60000)
            return 0

        if __name__ == "__main__":
            sys.exit(main())
        """))
    runner = ScriptRunner(p)
    res = hotspots.analyze(runner, line_backend="settrace")
    funcs = {f["function"]: f for f in res["lines"]["functions"]}
    assert funcs["<module>"]["hot_line"] == 14 and funcs["main"]["hot_line"] == 10, funcs
    module_line = next(r for r in funcs["<module>"]["lines"] if r["line"] == 14)
    assert module_line["share"] > 0.9 and module_line["time_s"] >= 0.95 * funcs["work"]["time_s"]
    assert runner.exits == []


# -- profile: an augmented assignment on a tensor is placed at its line ----------------------------------


def _qa11_accumulate(x, w):
    acc = torch.zeros_like(x)
    for _ in range(3):
        y = x @ w
        acc += y
        acc /= 2
    return acc


def test_an_in_place_operator_is_placed_at_its_line_not_at_the_def_line():
    # `acc += y` reaches the torch function mode as Tensor.add_: its key lost the '_' ('op:add') and never matched the
    # trace's aten::add_, so the op was placed at the function's `def` line
    first = _qa11_accumulate.__code__.co_firstlineno
    res = profile(_qa11_accumulate, torch.randn(8, 8), torch.randn(8, 8), steps=1, warmup=0, device="cpu",
                  hotspots=False)
    lines = {o["name"]: o["line"] for o in res.findings["top_ops"]}
    assert lines.get("aten::matmul") == first + 3, res.findings["top_ops"]
    assert lines.get("aten::add_") == first + 4 and lines.get("aten::div_") == first + 5, res.findings["top_ops"]


# -- profile: a script's own lines are timed even when library functions fill cProfile's top rows ------------


def test_a_script_whose_time_is_all_in_library_calls_still_gets_its_line_times(tmp_path):
    # the line timer took only user functions among cProfile's top 15 by self time: a script whose own code does
    # little but call into the standard library (or multiprocessing, argparse...) got 'no user Python functions to
    # time line by line' and no hot lines at all
    p = tmp_path / "fracs.py"
    p.write_text(textwrap.dedent("""\
        import statistics
        import textwrap
        from fractions import Fraction

        total = sum(map(Fraction, range(1, 3000)), Fraction(0))
        spread = statistics.stdev(map(Fraction, range(1, 400)))
        text = textwrap.fill(" ".join(map(str, range(4000))), width=30)
        """))
    res = hotspots.analyze(ScriptRunner(p), line_backend="settrace")
    assert not res["cprofile"]["hot_user"]  # the case at hand: no user row among the top ones
    (module,) = [f for f in res["lines"]["functions"] if f["function"] == "<module>"]
    timed = {r["line"] for r in module["lines"] if r["time_s"] > 0}
    assert {5, 6, 7} <= timed and module["hot_line"] in (5, 6, 7), module


# -- explain: a graph break before the first op is reported ---------------------------------------------


def _qa11_prints_first(x):
    print("qa11: entering")
    y = x.cos()
    print("qa11: halfway")
    return y.sin()


class _QA11Logged(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        print("qa11: forward")
        return self.lin(x).relu()


def test_explain_reports_a_break_that_comes_before_any_op(capsys):
    # torch._dynamo.explain records no reason for a break with no graph before it (a print at the top of a function or
    # a forward): explain() said '0 graph break(s); fullgraph=True fails', and the first of two prints went unnamed
    from gpuspeed.graph_breaks import explain

    first = _qa11_prints_first.__code__.co_firstlineno
    exp = explain(_qa11_prints_first, torch.randn(3, 4), check_fullgraph=False)
    assert [b.line for b in exp.breaks] == [first + 1, first + 3], exp.lines()
    assert exp.break_count == 2 and all("print" in b.source for b in exp.breaks), exp.lines()
    assert all("builtin operator" in b.reason for b in exp.breaks), exp.lines()

    exp = explain(_QA11Logged(), torch.randn(2, 4))
    fwd = _QA11Logged.forward.__code__.co_firstlineno
    assert exp.break_count == 1 and [b.line for b in exp.breaks] == [fwd + 1], exp.lines()
    assert exp.breaks[0].file == __file__ and exp.fullgraph_ok is False
    capsys.readouterr()


# -- profile: a script reading its standard input reads the same input in every run --------------------------


def test_every_run_of_a_script_reads_the_standard_input_it_was_given(tmp_path, monkeypatch):
    # `seq 1 20000 | gpuspeed profile sum.py`: the first run read the input, the later ones (source lines, cProfile,
    # line times) found it empty, so the hot loop over the input was never seen
    import io
    import sys

    seen = tmp_path / "seen.txt"
    p = tmp_path / "sumsq.py"
    p.write_text(textwrap.dedent(f"""\
        import sys
        first = sys.stdin.readline()
        words = first.split() + sys.stdin.read().split()
        open({str(seen)!r}, "a").write(f"{{len(words)}}\\n")
        total = 0
        for w in words:
            total += int(w) ** 2
        """))
    words = [str(v) for v in torch.randint(1, 1000, (20000,)).tolist()]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("\n".join(words).encode()), encoding="utf-8"))
    res = profile(ScriptRunner(p), steps=1, warmup=1, device="cpu", line_backend="settrace")
    assert seen.read_text().split() == ["20000"] * 5  # warm-up, profiled step, source lines, cProfile, line times
    loops = res.hotspots["hot_loops"]
    assert loops and loops[0]["line"] == 6, loops
    assert sys.stdin.read() == ""  # the caller's stdin is given back, consumed as `python sumsq.py` would leave it
