"""profile() of code that works in threads: cProfile and the line timer follow the calling thread only, so the
threads' work shows on the line that waits for them; the report says so (it pinned it on t.join() in silence)."""

import threading

from gpuspeed.profiling import profile


def spin(out, i, n):
    s = 0.0
    for k in range(n):
        s += k * 0.5
    out[i] = s


def in_threads(n):
    out = [0.0] * 3
    threads = [threading.Thread(target=spin, args=(out, i, n)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def in_this_thread(n):
    out = [0.0] * 3
    for i in range(3):
        spin(out, i, n)
    return out


def test_work_in_threads_is_said_to_be_unseen_by_the_line_timers():
    res = profile(in_threads, 20000, steps=1, hotspots=True)
    assert res.hotspots["cprofile"]["threads_started"] == 3  # idents a later thread reuses still count apart
    assert any("started 3 thread(s)" in n and "calling thread only" in n for n in res.notes), res.notes


def test_no_threads_no_note_and_a_users_own_thread_hook_is_kept():
    def own(frame, event, arg):
        return None

    threading.setprofile(own)
    try:
        res = profile(in_this_thread, 20000, steps=1, hotspots=True)
        assert threading.getprofile() is own
    finally:
        threading.setprofile(None)
    assert res.hotspots["cprofile"]["threads_started"] == 0
    assert not any("thread(s)" in n for n in res.notes), res.notes
