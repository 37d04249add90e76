"""Other processes on the GPU while bench() and peak_memory() measure (gpuspeed.sharing): the record NVML's
process lists and SM samples make, and the notes and flags it gives. The GPU half is tests/test_sharing_gpu.py."""

import json

from gpuspeed.sharing import memory_note, others, others_growth, shared, summarize_sharing
from gpuspeed.stats import Measurement, flags, summarize

OWN = 4242


def procs(*pairs):
    return [{"pid": pid, "used_bytes": used} for pid, used in pairs]


def test_a_busy_other_process_is_named_and_flags_the_run():
    record = summarize_sharing(procs((OWN, 2**30), (77, 2**31)), procs((OWN, 2**30), (77, 2**31)),
                               {OWN: 95, 77: 60}, OWN)
    assert record["other_processes"] == 1 and record["other_busy"] == {"77": 60}
    notes = []
    assert shared(record, notes) is True
    assert len(notes) == 1 and "pid 77 at up to 60 % SM" in notes[0]


def test_an_idle_context_elsewhere_is_not_a_shared_run():
    record = summarize_sharing(procs((OWN, 1), (77, 2)), procs((OWN, 1), (77, 2)), {OWN: 90, 77: 0}, OWN)
    notes = []
    assert shared(record, notes) is False and notes == []
    assert record["other_busy"] == {}


def test_alone_on_the_gpu_says_nothing():
    record = summarize_sharing(procs((OWN, 5)), procs((OWN, 5)), {OWN: 99}, OWN)
    assert record == {"other_processes": 0, "other_busy": {}, "other_used_bytes_before": 0,
                      "other_used_bytes_after": 0}
    notes = []
    assert shared(record, notes) is False and notes == [] and memory_note(record) is None


def test_unreadable_samples_with_others_present_are_said_so_without_a_flag():
    record = summarize_sharing(procs((OWN, 5), (9, 5)), procs((OWN, 5), (9, 5)), None, OWN)
    notes = []
    assert shared(record, notes) is False
    assert len(notes) == 1 and "1 other process(es) hold a CUDA context" in notes[0] and "could not be read" in notes[0]


def test_a_container_pid_namespace_counts_one_listed_process_as_ours():
    # NVML lists host pids: ours (OWN) is not among them, yet we hold a context, so one of them is us
    alone = summarize_sharing(procs((1001, None)), procs((1001, None)), {1001: 80}, OWN)
    assert alone["other_processes"] == 0 and alone["other_busy"] == {}
    assert shared(alone, []) is False
    two = summarize_sharing(procs((1001, None), (1002, None)), procs((1001, None), (1002, None)),
                            {1001: 80, 1002: 30}, OWN)
    assert two["other_processes"] == 1 and len(two["other_busy"]) == 1
    notes = []
    assert shared(two, notes) is True and "1 other process(es) computed" in notes[0]
    assert "other_used_bytes_before" not in two  # which memory is ours is unknown there


def test_no_process_list_claims_nothing():
    assert summarize_sharing(None, None, None, OWN) == {}
    notes = []
    assert shared({}, notes) is False and notes == [] and memory_note({}) is None


def test_others_memory_moving_during_a_peak_memory_call_is_noted_with_its_sign():
    grew = summarize_sharing(procs((OWN, 1), (8, 2**30)), procs((OWN, 1), (8, 3 * 2**30)), {}, OWN)
    why = memory_note(grew)
    assert why is not None and "changed by +2.00 GiB" in why and "left out of the peak" in why
    assert others_growth(grew) == 2 * 2**30
    shrank = summarize_sharing(procs((OWN, 1), (8, 3 * 2**30)), procs((OWN, 1), (8, 2**30)), {}, OWN)
    assert "changed by -2.00 GiB" in memory_note(shrank) and "left out" not in memory_note(shrank)
    assert others_growth(shrank) == 0 and others_growth({}) == 0
    steady = summarize_sharing(procs((OWN, 1), (8, 2**30)), procs((OWN, 1), (8, 2**30)), {}, OWN)
    assert memory_note(steady) is None  # present but idle and steady: NVML's reading is ours


def test_a_process_that_started_during_the_run_counts():
    record = summarize_sharing(procs((OWN, 1)), procs((OWN, 1), (31, 2**20)), {31: 40, OWN: 70}, OWN)
    assert record["other_processes"] == 1 and record["other_busy"] == {"31": 40}


def test_others_helper_keeps_every_pid_when_ours_is_not_listed():
    assert others([3, 1, 3], 1) == ([3], True)
    assert others([3, 2], 1) == ([2, 3], False)


def test_measurement_records_and_reads_back_the_sharing_flag():
    m = summarize([1e-3] * 20, name="f", device="gpu", mode="events", shared_gpu=True,
                  gpu_sharing={"other_processes": 1, "other_busy": {"7": 50}})
    assert "SHARED-GPU" in str(m) and flags(m.to_dict()) == flags(m) == " SHARED-GPU"
    back = Measurement.from_json(json.dumps(m.to_dict()))
    assert back.shared_gpu and back.gpu_sharing == {"other_processes": 1, "other_busy": {"7": 50}}
    old = {k: v for k, v in m.to_dict().items() if k not in ("shared_gpu", "gpu_sharing")}
    legacy = Measurement.from_dict(old | {"gpu_sharing": None})
    assert legacy.shared_gpu is False and legacy.gpu_sharing == {}


def test_no_samples_at_all_while_others_hold_contexts_is_unknown_not_idle():
    # we computed while measuring, so NVML sampling nobody means it does not sample processes here
    record = summarize_sharing(procs((OWN, 5), (9, 5)), procs((OWN, 5), (9, 5)), {}, OWN)
    assert "other_busy" not in record
    notes = []
    assert shared(record, notes) is False and "could not be read" in notes[0]
