"""Round 22 docs QA: a first-time user reads the README against the files it cites."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
H200 = ROOT / "results" / "nvidia-h200"
HAND_KERNELS = ROOT / "src" / "gpuspeed" / "examples" / "hand_kernels"
WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def test_the_count_of_examples_with_numba_kernels_is_kernels_json_s():
    """The README said 'three of the four examples with Numba kernels use warp reductions or shared-memory tiles'
    where kernels.json times Numba kernels of five examples (pairwise_distance, heat_stencil, histogram, mandelbrot
    and row_stats; the four before row_stats's kernel was added were already four). The three: the examples whose
    Numba kernel declares a shared array or shuffles within a warp."""
    rows = json.loads((H200 / "kernels.json").read_text(encoding="utf-8"))["rows"]
    numba = sorted({r["example"] for r in rows if r["backend"] == "numba"})
    tiled = [e for e in numba
             if re.search(r"cuda\.shared\.array|cuda\.shfl_", (HAND_KERNELS / f"{e}.py").read_text(encoding="utf-8"))]
    phrase = (f"{WORDS[len(tiled)]} of the {WORDS[len(numba)]} examples with Numba kernels use warp reductions or "
              "shared-memory tiles")
    assert phrase in README, f"kernels.json's Numba examples {numba}, of which {tiled} tile or shuffle: {phrase!r}"


def test_every_input_option_names_the_float_scalar_its_parser_takes():
    """`gpuspeed optimize --help` said `--input NAME=DTYPE[SHAPE] or NAME=int:VALUE`, where its specs go through the
    same parser as profile's and kernel's (gpuspeed.inputs), which takes NAME=float:VALUE too: black_scholes's rate and
    vol are floats, and report E's own profile command passes them as `rate=float:0.03`."""
    import typer

    from gpuspeed.cli import app
    from gpuspeed.inputs import parse_spec

    assert parse_spec("rate=float:0.03").name == "rate"  # what the help must then name
    group = typer.main.get_command(app)
    helps = {name: param.help for name, command in group.commands.items() for param in command.params
             if "--input" in getattr(param, "opts", [])}
    assert {"optimize", "profile", "kernel"} <= set(helps), helps
    missing = {name: text for name, text in helps.items() if "NAME=float:VALUE" not in text}
    assert not missing, missing


def test_the_readme_says_which_call_refuses_a_decode_spec_field_of_the_wrong_kind():
    """The README said '`Spec` ... refuses a numeric field of the wrong kind (`batch=1.5`, `bench_budget_s="1"`) in one
    line', where `study.Spec(batch=1.5)` is built without a word and `study.run` refuses it, before any work: a user
    who builds a Spec in one cell and runs it in another looks for the error in the wrong place."""
    import pytest

    from gpuspeed.decode import study
    from gpuspeed.errors import UserError

    (sentence,) = [s for s in re.split(r"(?<=;)\s", README) if "`batch=1.5`" in s]
    spec = study.Spec(model="tiny", device="cpu", variants="V2", batch=1.5)  # built as it is written
    with pytest.raises(UserError, match=r"^batch must be an integer"):
        study.run(spec)
    assert "`study.run` refuses a numeric field of the wrong kind" in sentence, sentence
