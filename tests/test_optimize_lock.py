"""The optimize run's device lock: a candidate being checked steps aside between stages, so a waiting measurement
waits for the stage in flight, not for all of the candidate's checks (worker._Held)."""

import threading
import time

from gpuspeed.optimize.worker import _Held, _slot


def test_a_waiting_measurement_gets_in_between_a_candidates_stages(tmp_path):
    spec = {"lock": str(tmp_path / "device.lock")}
    stage_s, log = 0.5, []

    def candidate():  # build, then three seeds, as worker._check runs them
        with _Held(spec, "compile", lambda _s: None) as held:
            for n in range(4):
                held.step_aside()
                log.append(("stage", n, time.perf_counter()))
                time.sleep(stage_s)

    t = threading.Thread(target=candidate)
    t.start()
    time.sleep(0.15)  # the candidate is in its first stage
    t0 = time.perf_counter()
    with _slot(spec, "measure", lambda _s: None):
        got = time.perf_counter() - t0
        stages_before = len(log)
        time.sleep(0.05)
    t.join(timeout=30)
    # it waited for the stage in flight (~0.35 s left of 0.5), not for all four (~1.85 s)
    assert got < stage_s + 0.6, got
    assert stages_before < 4, stages_before
    assert len(log) == 4  # and the candidate then finished its stages


def test_without_a_lock_stepping_aside_is_a_no_op():
    with _Held({}, "compile", lambda _s: None) as held:
        held.step_aside()
