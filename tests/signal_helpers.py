"""Signals for tests that stop a gpuspeed subprocess from outside.

A test run started in the background (`make test &`, a CI runner without job control) inherits SIGINT ignored,
and gpuspeed keeps a signal its caller ignores (a background job must not answer the terminal's Ctrl-C). A test
that means "the user pressed Ctrl-C" (or "`timeout` sent SIGTERM") starts its child as a command typed at a
terminal is started: both signals at their defaults.
"""

import signal


def at_a_terminal() -> None:
    """preexec_fn for subprocess.Popen: SIGINT and SIGTERM back to their defaults in the child."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def ignoring(sig: int):
    """preexec_fn for subprocess.Popen: the child starts with `sig` ignored (`trap '' TERM`, a script's `cmd &`)."""
    def ignore() -> None:
        signal.signal(sig, signal.SIG_IGN)
    return ignore


def tagged_processes(tag: str) -> list[str]:
    """The pids of live processes whose environment holds GPUSPEED_TEST_TAG=tag (a run's leftovers)."""
    from pathlib import Path

    left = []
    for env_file in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"GPUSPEED_TEST_TAG={tag}".encode() in env_file.read_bytes():
                left.append(env_file.parent.name)
        except OSError:  # gone, or not ours to read
            continue
    return left
