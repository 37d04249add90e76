"""The primary's speedup confirmed before the verdict: the original and the primary timed alternately in one worker
(worker.confirm), and the ratio the run publishes held against theirs.

Each candidate and the original are timed in their own processes, at different moments: a load burst during one of
them skews the ratio (on a 2-core machine at a load of 5, a torch candidate whose code was the original's read
157x: the original timed at 29.7 ms, against 0.18 ms when quiet). Timed alternately, A B A B, both sides meet the
same machine state; the confirmed ratio is the median of the rounds' ratios, their spread its interval.
"""

from __future__ import annotations

import statistics

from gpuspeed.stats import format_time

ROUNDS = 5
FEWEST_ROUNDS = 3  # where five would not fit the time left
MAX_CONFIRMED = 3  # candidates confirmed in turn when a primary loses its place to the original
# two timings taken apart drift by more than their own noise on a shared machine (clocks, the heap): a confirmed
# interval within this of the separate CI agrees; the hazard guarded against is of another size (157x against 1x)
SLACK = 0.25
WARM_CALLS = 5  # bench()'s least calls a side (two warm-up calls, three samples): the estimate of a round's time
BENCH_SHARE = 1 / ROUNDS  # of --bench-budget, each side's bench() in a round: all rounds together cost a candidate's timing
WORKER_START_S = 1.0  # a worker's interpreter and imports, before its first stage: not in a candidate's stage_s
START_GUESS_S = 20.0  # a confirmation worker's start before the primary is known: load, build both, a compile
# of the candidates' span (--time-budget less the report's last seconds): the most kept for the confirmation. Three
# rounds of an original of 6.2 s a call (pairwise_distance on the H200: five calls a side a round) and a start need
# ~115 s of a 300 s run
RESERVE_SHARE = 0.4


def recipe(row: dict, rank_by: str, rounds: int) -> dict:
    """The confirmation worker's recipe: the candidate's own (backend, precision, mode, chunking), renamed."""
    rec = dict(row["recipe"]) | {"name": f"confirm:{row['name']}", "confirm_of": row["name"], "rank_by": rank_by,
                                 "rounds": rounds}
    if rec.get("chunk"):
        rec["chunk_size"] = row.get("chunk_size")  # the size its own worker planned: the same chunks
    return rec


def _median(r: dict, key: str) -> float:
    return (r.get(key) or {}).get("median") or 0.0


def _side_s(t: float, bench_budget_s: float) -> float:
    """One side's bench() in a round: its least calls or its share of the bench budget, whichever is longer."""
    return max(WARM_CALLS * t, BENCH_SHARE * bench_budget_s)


def two_way(row: dict) -> bool:
    """Whether the worker timed the candidate end to end apart from device-resident (its e2e_time is its own)."""
    return bool(row.get("e2e_time")) and row.get("e2e_time") != row.get("device_time")


def estimate_s(original: dict, row: dict, rounds: int, bench_budget_s: float) -> float:
    """A rough estimate of a confirmation's wall time: the candidate's own worker's start (load, build, first call),
    then each round's bench() calls a side (end to end only where the candidate has a way of its own)."""
    stages = row.get("stage_s") or {}
    start = sum(v for k, v in stages.items() if not k.startswith(("timing", "memory", "waiting", "correctness")))
    ways = ("device_time", "e2e_time") if two_way(row) else ("device_time",)
    return start + rounds * (_side_s(_median(original, "device_time"), bench_budget_s)
                             + sum(_side_s(_median(row, w), bench_budget_s) for w in ways))


def reserve_s(original_s: float, bench_budget_s: float, candidates_s: float, least_s: float = 0.0) -> float:
    """Time kept at the end of the candidates' span for the confirmation, before any candidate is timed: a guessed
    start, then ROUNDS rounds of the original (its rough time a call) and a fast GPU candidate both ways; at most
    RESERVE_SHARE of the span (the candidates come first: a confirmation that does not fit what is left is skipped).
    None under `least_s`, a candidate's least limit: so small a reserve takes a candidate's start (under --time-budget
    25 it left none one) for a confirmation that may as well run on what the candidates leave (its estimate decides)."""
    est = START_GUESS_S + ROUNDS * (_side_s(original_s, bench_budget_s) + 2 * _side_s(0.0, bench_budget_s))
    kept = min(est, RESERVE_SHARE * max(candidates_s, 0.0))
    return kept if kept >= least_s else 0.0


def unconfirmable(original: dict, row: dict) -> str | None:
    """Why the pair cannot be timed alternately the way the run timed them, or None."""
    for name, r in (("the original", original), (row["name"], row)):
        if r.get("caches_results"):
            return (f"{name} caches its results by input: its time is that of calls on fresh inputs, which repeated "
                    "alternating calls would not reproduce")
    return None


def judge(row: dict, confirm_row: dict, rank_by: str) -> dict:
    """The confirmation of a primary's speedup from its worker's rounds: agreed (the confirmed interval meets the
    separate CI, within SLACK), or replaced; `demoted` when replaced by a ratio under 1 (the original is faster)."""
    key = "e2e_time" if rank_by == "e2e" and "e2e_time" in confirm_row.get("ways", []) else "device_time"
    label = "speedup_e2e" if rank_by == "e2e" else "speedup"
    rounds = confirm_row["rounds"]
    ratios = {w: [r["original"] / r[w] for r in rounds if r.get(w)] for w in confirm_row.get("ways", ["device_time"])}
    ranked = ratios[key]
    ratio, low, high = statistics.median(ranked), min(ranked), max(ranked)
    separate = row.get(label) or {}
    sep_low, sep_high = separate.get("ci_low"), separate.get("ci_high")
    agreed = (sep_low is None or sep_high is None) or (low / (1 + SLACK) <= sep_high and sep_low <= high * (1 + SLACK))
    if agreed and sep_low is not None and sep_high is not None \
            and not sep_low / (1 + SLACK) <= ratio <= sep_high * (1 + SLACK):
        # the rounds' range meets the separate CI only through rounds far from their own median (0.0055x [0.0055,
        # 1.26] read "agrees with 1.24x" on a loaded machine): they neither confirm the speedup nor replace it
        return {"candidate": row["name"], "status": "inconclusive", "rounds": len(ranked), "ratio": ratio, "low": low,
                "high": high, "ratios": ranked, "separate": separate.get("speedup"), "separate_ci": [sep_low, sep_high],
                "agreed": False, "replaced": False, "demoted": False,
                "reason": f"its {len(ranked)} rounds disagree with each other ({_x(low)}x to {_x(high)}x, median "
                          f"{_x(ratio)}x, against {_x(separate.get('speedup'))}x timed apart): the machine's state moved "
                          "while they ran"}
    out = {"candidate": row["name"], "status": "ok", "rounds": len(ranked),
           "original_s": statistics.median(r["original"] for r in rounds),
           "candidate_s": statistics.median(r[key] for r in rounds if r.get(key)),
           # the candidate's median each way: the emitted script gives its end to end one
           "times": {w: statistics.median(r[w] for r in rounds if r.get(w)) for w in ratios if ratios[w]},
           "timed": "end to end" if rank_by == "e2e" else "device-resident", "ratio": ratio, "low": low, "high": high,
           "ratios": ranked,
           "separate": separate.get("speedup"), "separate_ci": [sep_low, sep_high], "agreed": bool(agreed),
           "replaced": not agreed, "demoted": bool(not agreed and ratio < 1)}
    if not agreed:
        out["confirmed"] = {w: _comparison(rs) for w, rs in ratios.items()}
    return out


def _comparison(ratios: list[float]) -> dict:
    """gpuspeed.compare's fields from the rounds' ratios: their median, their range as its interval (five rounds:
    the median lies inside with 94 % confidence) and the verdict compare() would give that interval."""
    ratio, low, high = statistics.median(ratios), min(ratios), max(ratios)
    verdict = "faster" if low > 1 and ratio > 1.01 else "slower" if high < 1 and ratio < 1 / 1.01 else "same"
    return {"speedup": ratio, "ci_low": low, "ci_high": high, "verdict": verdict, "confirmed": True}


def rounds_verdict(ratios: list[float]) -> str:
    """compare()'s verdict on the rounds' ratios: "faster" only where every round found the candidate faster."""
    return _comparison(ratios)["verdict"]


def rescaled(speedup: dict, factor: float) -> dict:
    """A speedup over the original's separate time, which a replaced confirmation found off by `factor` (its time
    there over its separate one)."""
    return _comparison([speedup["ci_low"] * factor, speedup["speedup"] * factor, speedup["ci_high"] * factor]) | {
        "confirmed": False, "rescaled": factor}


def apply(row: dict, conf: dict) -> None:
    """A replaced speedup: the candidate's row holds the confirmed one, the separate one kept beside it."""
    if not conf.get("replaced"):
        return
    by_way = conf["confirmed"]
    for label, way in (("speedup", "device_time"), ("speedup_e2e", "e2e_time")):
        if row.get(label):
            row[f"separate_{label}"] = row[label]
            row[label] = by_way.get(way) or by_way["device_time"]  # one way timed: end to end is device-resident


def line(conf: dict) -> str:
    """The report's and the JSON's one line on a confirmation."""
    name = conf["candidate"]
    if conf.get("status") != "ok":
        return f"{name}'s speedup is not confirmed ({conf.get('reason')}): it is from timings taken apart"
    took = (f"timed alternately with the original in one process ({conf['rounds']} rounds, {conf['timed']}), "
            f"{name} is {_x(conf['ratio'])}x [{_x(conf['low'])}, {_x(conf['high'])}] (the original "
            f"{format_time(conf['original_s'])} a call, {name} {format_time(conf['candidate_s'])})")
    if conf["agreed"] and rounds_verdict(conf["ratios"]) != "faster":
        # within the slack two timings apart are allowed, and not established faster: no reason to replace the original
        return (f"{took}: within the slack of the separate timings ({_x(conf['separate'])}x), but its rounds do not "
                "establish it faster than the original, so it does not take the original's place")
    if conf["agreed"]:
        return f"{took}: it agrees with the separate timings ({_x(conf['separate'])}x)"
    why = (f"the separate timings said {_x(conf['separate'])}x [{_x(conf['separate_ci'][0])}, "
           f"{_x(conf['separate_ci'][1])}], replaced: the original or {name} was timed in another machine state (a load "
           "burst, clocks) when each was timed in its own process")
    if conf.get("demoted"):
        why += "; the original is faster, so it loses its place"
    return (f"{took}; {why} (where the original's own time moved, the other candidates' speedups over it are rescaled "
            "to its time here)")


def _x(v) -> str:
    if v is None:
        return "?"
    if v == float("inf"):
        return "inf"
    return f"{v:.3g}"
