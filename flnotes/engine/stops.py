"""Stopping a run: Ctrl-C and SIGTERM stop it resumably, with the shell's exit statuses
and a line saying how to continue (:func:`interruption_report`); a caller in another thread
stops runs the same way (:func:`stop_when`, a notebook explorer's race that a newer move
makes stale)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

from flnotes.engine.run_folder import RunFolderError, _read_json

EXIT_INTERRUPTED = 130  # what a shell reports for a command stopped by Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_READER_LEFT = 141  # 128 + SIGPIPE: a command whose output's reader went away


class ReaderLeft(KeyboardInterrupt):
    """The reader of the command's output went away (``flnotes run ... | head``), raised
    where its next line was printed: the run stops as on Ctrl-C (folder marked interrupted,
    resumable, the resume line on stderr) rather than failing on the broken pipe, and the
    command exits 141, as one stopped by SIGPIPE."""


def send_nowhere(stream=None) -> None:
    """After a BrokenPipeError on ``stream`` (default stdout): the rest of it goes to
    os.devnull, so that neither a later line nor Python's flush at exit raises again."""
    stream = sys.stdout if stream is None else stream
    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def reader_left() -> ReaderLeft:
    """After a BrokenPipeError on stdout: the rest of stdout goes nowhere
    (:func:`send_nowhere`); returns the stop to raise."""
    send_nowhere()
    return ReaderLeft("the reader of the output went away (a closed pipe)")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be: the run stops the same way
    (folder marked interrupted, resume hint), and the command exits 143."""


class Stopped(KeyboardInterrupt):
    """The stop a caller asked for (:func:`stop_when`), raised where Ctrl-C's
    KeyboardInterrupt would be, at the start of a round: the run stops the same way (a run
    folder is marked interrupted and resumes), so every cleanup that Ctrl-C gets it gets."""


_STOP = threading.local()  # .event: the threading.Event that stops this thread's runs


@contextlib.contextmanager
def stop_when(event: threading.Event):
    """Within the block, this thread's runs stop (:class:`Stopped`) at the next round once
    ``event`` is set (by any thread): a worker thread made stoppable without killing it."""
    if not callable(getattr(event, "is_set", None)):
        raise TypeError(f"stop_when needs a threading.Event, got {type(event).__name__} "
                        f"{event!r:.40}")
    before = getattr(_STOP, "event", None)
    _STOP.event = event
    try:
        check_stop()  # set already: no round starts
        yield
    finally:
        _STOP.event = before


def check_stop() -> None:
    """Raise :class:`Stopped` if this thread's :func:`stop_when` event is set (the round
    loops call it before every round; a dictionary lookup otherwise)."""
    event = getattr(_STOP, "event", None)
    if event is not None and event.is_set():
        raise Stopped()


def exit_code(stop: KeyboardInterrupt) -> int:
    """The exit status of a command stopped by Ctrl-C (130), SIGTERM (143) or its output's
    reader going away (141)."""
    return (EXIT_READER_LEFT if isinstance(stop, ReaderLeft)
            else EXIT_TERMINATED if isinstance(stop, Terminated) else EXIT_INTERRUPTED)


@contextlib.contextmanager
def terminate_like_ctrl_c():
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread (the command
    line's runs and sweeps); the previous handler is put back after it."""

    def handler(signum, frame):
        raise Terminated()

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def interruption_report(run_dir: str | Path) -> str:
    """How far a stopped run folder got and how to go on (a line for the command line).

    Reads run.json and metrics.jsonl only: :meth:`Simulation.interrupt` has marked the
    folder "interrupted" (run and run_seeds call it on Ctrl-C).
    """
    run_dir = Path(run_dir)
    meta_file = run_dir / "run.json"
    if not meta_file.exists():
        return "interrupted before the first round; run the same command again to start over"
    try:
        meta = _read_json(meta_file)
    except RunFolderError as err:
        return f"{err}; run the same command again to resume from the last checkpoint"
    if meta.get("status") in ("completed", "diverged"):  # e.g. a seed that finished first
        return f"{meta['status']}; nothing to resume"
    last = _last_logged_round(run_dir / "metrics.jsonl")
    done = f"after round {last}" if last else "in its first round"
    checkpoint = meta.get("checkpoint_round")
    if checkpoint is None and (run_dir / "checkpoint.pt").exists():
        where = "the last checkpoint"  # a folder from before run.json named the round
    elif checkpoint:
        where = f"the last checkpoint (round {checkpoint})"
    else:
        every = meta.get("config", {}).get("checkpoint_every", "?")
        return (f"interrupted {done}, before the first checkpoint (one every {every} rounds); "
                "run the same command again to start over")
    return f"interrupted {done}; run the same command again to resume from {where}"


def _last_logged_round(metrics_file: Path) -> int:
    """The last round written to metrics.jsonl (0 if none; a half-written line is skipped)."""
    last = 0
    if metrics_file.exists():
        for line in metrics_file.read_text().splitlines():
            try:
                last = int(json.loads(line)["round"])
            except (ValueError, KeyError, TypeError):
                continue
    return last


