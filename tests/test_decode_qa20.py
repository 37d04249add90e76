"""Round 20 QA of `gpuspeed decode`: what a demanding user tuning batch-1 decode of their own checkpoint still hit
on the CPU."""

from __future__ import annotations

import json

import pytest

from decode_cli_helpers import SMALL, cli, one_line


def _host_memory() -> int:
    """This host's memory in bytes; the test is skipped where it is unknown."""
    from gpuspeed.device import get_device

    have = get_device("cpu").mem_bytes
    if not have:
        pytest.skip("this host's memory is unknown")
    return have


def test_a_naive_rung_past_the_hosts_memory_is_skipped_with_why_not_oom_killed(capsys):
    # --batch 64 --prompt-len 2000 on the CPU: V0 recomputes [B, P + T, vocab] logits each step (33 GB for tiny),
    # which the memory check did not count: the OOM killer ended the run (exit 137, nothing kept). Now V0 is skipped,
    # its row says why, and the check is made before anything that large is allocated
    have = _host_memory()
    # a batch whose V0 logits (2 x B x 10 positions x 32000 x 4 bytes) pass 0.8 of the host's memory, while its KV
    # cache and kept logits (~0.45 MB a sequence) stay well inside it
    batch = int(0.9 * have / (2 * 10 * 32000 * 4)) + 1
    rc, cap = cli(["--model", "tiny", "--layers", "1", "--prompt-len", "8", "--batch", str(batch), "--read-roof", "10",
                   *[a for a in SMALL if a != "V2"], "V0", "--json"], capsys)
    assert rc == 1, cap.err  # nothing measured: said, and exit 1
    doc = json.loads(cap.out)
    (row,) = doc["rows"]
    assert row["variant"] == "V0" and "ms_per_token" not in row
    assert row["skipped"].startswith("not run: V0 recomputes every position's logits") and "GiB" in row["skipped"]
    assert row["skipped"] in cap.err and "Traceback" not in cap.err  # the reason whole in the nothing-measured line


def test_spec_takes_the_variants_as_the_command_line_writes_them():
    # Spec(variants="V2,V5") was read letter by letter: "unknown variant(s) ['V', '2', ',', 'V', '5']"
    from gpuspeed.decode import study

    assert study.Spec(variants="V2, v5").variants == ["V2", "V5"]
    assert study.Spec(variants="all").variants == study.Spec().variants
    study.check_spec(study.Spec(variants="V0,V2"))  # no refusal: the string names two rungs


def test_spec_with_sampling_none_is_greedy():
    # Spec(sampling=None) ran the whole model load, then failed with AttributeError: 'NoneType' ... '__dict__'
    from gpuspeed.decode import study
    from gpuspeed.decode.generate import Sampling

    assert study.Spec(sampling=None).sampling == Sampling()


def test_profiled_rungs_caches_held_together_are_counted_before_the_run(capsys):
    # every profiled rung keeps its engine and KV cache until the profiling passes at the end, but the memory check
    # counted one cache: a batch whose single cache fit ran on, to the OOM killer on the CPU (or a CUDA OOM on the
    # later rungs on a GPU, each of which alone would fit). Now refused before loading, --no-profile named
    from gpuspeed.decode import study
    from gpuspeed.errors import UserError

    have = _host_memory()
    # tiny, one layer, 8 + 2 positions (a cache of 48): a sequence's cache is 196608 bytes and its kept logits
    # 256000, so one rung's share is ~0.65 of the host and three held caches ~1.2 of it
    batch = int(0.9 * 0.8 * have / (196608 + 256000))
    args = ["--model", "tiny", "--layers", "1", "--prompt-len", "8", "--new-tokens", "2", "--batch", str(batch),
            "--variants", "V1,V2,V4", "--device", "cpu"]
    spec = study.Spec(model="tiny", max_layers=1, prompt_len=8, new_tokens=2, batch=batch, variants="V1,V2,V4",
                      device="cpu")
    with pytest.raises(UserError, match="--no-profile: the 3 rungs profiled keep their caches"):
        study.check_fits(spec, "cpu")
    study.check_fits(study.Spec(**{**spec.__dict__, "profile": False}), "cpu")  # one cache at a time: it fits
    rc, cap = cli(args, capsys)
    one_line(rc, cap, "--no-profile")
