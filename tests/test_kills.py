"""Kill a run at every write point of its folder, at random times and inside a
client-state file's write, then resume it: the folder must end equal to an uninterrupted
run's, bit for bit, metrics, checkpoint and global_model.pt included, and say
``completed``."""

import io
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from flnotes.config import RunConfig
from flnotes.engine import run_folder, sim

ROUNDS = 3


def _config(run_dir) -> RunConfig:
    return RunConfig(dataset="synthetic", model="mlp", num_clients=10, clients_per_round=5,
                     rounds=ROUNDS, batch_size=32, lr=0.05, momentum=0.5, seed=3,
                     checkpoint_every=1, data_options={"num_train": 600, "num_test": 200},
                     device="cpu", backend="loop", run_dir=str(run_dir))


def _in_child(body) -> int:
    """Run body() in a forked child; return how it ended (exit status or -signal)."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            body()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _folder(run_dir) -> dict:
    """What a finished folder holds, in a form compared exactly (seconds left out)."""
    meta = json.loads((run_dir / "run.json").read_text())
    rows = [{k: v for k, v in json.loads(line).items() if k != "seconds"}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    checkpoint = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    model = torch.load(run_dir / "global_model.pt", weights_only=True)
    return {"status": meta["status"], "checkpoint_round": meta["checkpoint_round"],
            "rows": rows, "round": checkpoint["round"],
            "checkpoint_rows": [{k: v for k, v in r.items() if k != "seconds"}
                                for r in checkpoint["rows"]],
            "global": checkpoint["strategy"]["global_state"], "model": model}


def _assert_same(got: dict, want: dict, trial: str) -> None:
    for key in ("status", "checkpoint_round", "rows", "round", "checkpoint_rows"):
        assert got[key] == want[key], f"{trial}: {key} differs"
    for key in ("global", "model"):
        assert list(got[key]) == list(want[key]), f"{trial}: {key} layers differ"
        for name in want[key]:
            assert torch.equal(got[key][name], want[key][name]), f"{trial}: {key}[{name}]"


# Every file write of a run folder goes through one of these (run.json through _write_text).
WRITERS = ("_atomic_save", "_write_text", "_append_row")


def _killed_at(point: int, after: bool):
    """A run that SIGKILLs itself at its point-th folder write (before or after it)."""
    def body(run_dir):
        count = [0]
        for name in WRITERS:
            original = getattr(run_folder, name)

            def wrapper(*args, _original=original, **kwargs):
                count[0] += 1
                if count[0] == point and not after:
                    os.kill(os.getpid(), signal.SIGKILL)
                result = _original(*args, **kwargs)
                if count[0] == point and after:
                    os.kill(os.getpid(), signal.SIGKILL)
                return result

            setattr(run_folder, name, wrapper)
        sim.run(_config(run_dir), progress=False)
    return body


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's folder, and how many folder writes it makes."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    count = [0]
    originals = {name: getattr(run_folder, name) for name in WRITERS}

    def counting(original):
        def wrapper(*args, **kwargs):
            count[0] += 1
            return original(*args, **kwargs)
        return wrapper

    try:
        for name, original in originals.items():
            setattr(run_folder, name, counting(original))
        sim.run(_config(run_dir), progress=False)
    finally:
        for name, original in originals.items():
            setattr(run_folder, name, original)
    return _folder(run_dir), count[0]


def test_kill_at_every_write_point_resumes_identically(tmp_path, reference):
    want, writes = reference
    # config.json, metrics.jsonl, run.json (twice: created, then running); then a row,
    # a checkpoint and run.json a round; then checkpoint, model and run.json
    assert writes == 4 + 3 * ROUNDS + 3
    trials = identical = 0
    for point in range(1, writes + 1):
        for after in (False, True):
            run_dir = tmp_path / f"kill{point}{'after' if after else 'before'}"
            killed = _killed_at(point, after)
            assert _in_child(lambda d=run_dir, k=killed: k(d)) == -signal.SIGKILL, (point, after)
            assert _in_child(lambda d=run_dir: sim.run(_config(d), progress=False)) == 0
            trial = f"SIGKILL {'after' if after else 'before'} write {point} of {writes}"
            _assert_same(_folder(run_dir), want, trial)
            trials, identical = trials + 1, identical + 1
    assert trials == identical == 2 * writes


def test_kill_at_random_times_resumes_identically(tmp_path, reference):
    """SIGKILL, SIGINT and SIGTERM at random moments of a run (seeded: the same moments on
    every run of the test)."""
    want, _ = reference
    rng = random.Random(13)
    # The duration of one run here, to spread the kills over it.
    tic = time.perf_counter()
    sim.run(_config(tmp_path / "timing"), progress=False)
    duration = time.perf_counter() - tic
    stopped = 0  # SIGINT/SIGTERM trials that landed while the folder was open
    for trial, sig in enumerate([signal.SIGKILL] * 6 + [signal.SIGINT, signal.SIGTERM] * 2):
        run_dir = tmp_path / f"random{trial}"

        def body(d=run_dir):
            try:
                with sim.terminate_like_ctrl_c():  # SIGTERM as the command line takes it
                    sim.run(_config(d), progress=False)
            except KeyboardInterrupt:
                os._exit(130)
            time.sleep(60)  # finished before the signal: wait for it, as a slow run would

        pid = os.fork()
        if pid == 0:
            try:
                body()
            finally:
                os._exit(1)
        if sig == signal.SIGKILL:
            time.sleep(rng.uniform(0.05, 1.1) * duration)
        else:
            # Ctrl-C and SIGTERM at a random moment once the run has opened its folder: timed
            # from the fork alone, all four once landed after the run had finished (the timing
            # run above slowed by the other test worker), so the path under test went untried.
            _wait_for(run_dir / "run.json", pid)
            time.sleep(rng.uniform(0.0, 0.6) * duration)
        os.kill(pid, sig)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if sig != signal.SIGKILL and code == 130 and (run_dir / "run.json").exists():
            # Stopped mid-run (not before the folder was opened): the folder says so.
            meta = json.loads((run_dir / "run.json").read_text())
            assert meta["status"] == "interrupted", f"trial {trial}"
            stopped += 1
        assert _in_child(lambda d=run_dir: sim.run(_config(d), progress=False)) == 0
        _assert_same(_folder(run_dir), want, f"trial {trial} ({signal.Signals(sig).name})")
    assert stopped >= 1  # the Ctrl-C/SIGTERM path was taken, not only kills and finished runs


def _wait_for(path, pid: int, timeout: float = 60.0) -> None:
    """Until ``path`` exists (the child ``pid`` made it), or the child has ended."""
    end = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < end:
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            raise AssertionError(f"the run ended before it made {path}")
        time.sleep(0.002)


def test_missing_model_is_rebuilt_from_the_checkpoint(tmp_path, reference):
    want, _ = reference
    run_dir = tmp_path / "run"
    sim.run(_config(run_dir), progress=False)
    (run_dir / "global_model.pt").unlink()
    history = sim.run(_config(run_dir), progress=False)
    assert history.status == "completed"
    _assert_same(_folder(run_dir), want, "deleted global_model.pt")


def test_two_runs_on_one_folder_never_mix(tmp_path, reference):
    """Started together on one folder: the second is refused while the first holds it (or,
    started after it ended, reloads it); the folder ends as one uninterrupted run."""
    want, _ = reference
    for trial in range(3):
        run_dir = tmp_path / f"race{trial}"

        def body(d=run_dir):
            try:
                sim.run(_config(d), progress=False)
            except sim.RunFolderError as err:
                assert "is in use by pid" in str(err)
                os._exit(4)

        pids = []
        for _ in range(2):
            pid = os.fork()
            if pid == 0:
                try:
                    body()
                finally:
                    os._exit(0)
            pids.append(pid)
        codes = sorted(os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in pids)
        assert codes in ([0, 0], [0, 4]), f"trial {trial}: {codes}"
        _assert_same(_folder(run_dir), want, f"race {trial}")


def test_run_json_records_each_start(tmp_path):
    run_dir = tmp_path / "run"
    sim.run(_config(run_dir).replace(rounds=2), progress=False)
    sim.run(_config(run_dir), progress=False)
    starts = json.loads((run_dir / "run.json").read_text())["environment"]["starts"]
    threads = torch.get_num_threads()
    assert [(s["round"], s["cpu_threads"]) for s in starts] == [(1, threads), (3, threads)]
    sim.run(_config(run_dir), progress=False)  # reloading a finished folder is no start
    assert json.loads((run_dir / "run.json").read_text())["environment"]["starts"] == starts


def test_reloading_a_finished_folder_writes_nothing(tmp_path):
    run_dir = tmp_path / "run"
    sim.run(_config(run_dir), progress=False)
    files = {f.name: f.read_bytes() for f in run_dir.iterdir() if f.name != "run.lock"}
    history = sim.run(_config(run_dir).replace(device="cpu", backend="auto"), progress=False)
    assert history.status == "completed"
    assert {f.name: f.read_bytes() for f in run_dir.iterdir() if f.name != "run.lock"} == files


# ---- inside a client-state write ----------------------------------------------
def _scaffold(run_dir) -> RunConfig:
    """The same run with a method that writes client-state files (5 a round)."""
    return _config(run_dir).replace(algorithm="scaffold", momentum=0.0)


@pytest.fixture(scope="module")
def scaffold_reference(tmp_path_factory):
    """The uninterrupted SCAFFOLD run's folder, and how many client-state files it writes."""
    from flnotes.engine import client_state

    run_dir = tmp_path_factory.mktemp("scaffold") / "run"
    real, count = client_state.write_atomically, [0]

    def counting(path, write):
        count[0] += 1
        return real(path, write)

    client_state.write_atomically = counting
    try:
        sim.run(_scaffold(run_dir), progress=False)
    finally:
        client_state.write_atomically = real
    return {**_folder(run_dir), "client_states": _client_states(run_dir)}, count[0]


def _client_states(run_dir) -> dict:
    """The final checkpoint's client-state record (client -> round, client -> sha256 of its
    file) and the bytes of every client-state file in the folder."""
    record = torch.load(run_dir / "checkpoint.pt", weights_only=True)["strategy"]["clients"]
    files = {p.name: p.read_bytes() for p in (run_dir / "client_states").rglob("*.pt")}
    return {"record": record, "files": files}


def _signalled_inside_state_write(point: int, sig: int):
    """A SCAFFOLD run that sends itself ``sig`` halfway through the bytes of its point-th
    client-state file (the .tmp file half written), then, if still alive, writes the rest."""
    def body(run_dir):
        from flnotes.engine import client_state

        real, count = client_state.write_atomically, [0]

        def halfway(path, write):
            count[0] += 1
            if count[0] != point:
                return real(path, write)

            def write_in_two(f):
                buffer = io.BytesIO()
                write(buffer)
                data = buffer.getvalue()
                f.write(data[: len(data) // 2])
                f.flush()
                os.kill(os.getpid(), sig)
                f.write(data[len(data) // 2:])
            return real(path, write_in_two)

        client_state.write_atomically = halfway
        try:
            with sim.terminate_like_ctrl_c():  # SIGTERM as the command line takes it
                sim.run(_scaffold(run_dir), progress=False)
        except KeyboardInterrupt as stop:
            os._exit(sim.exit_code(stop))
    return body


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_signal_inside_a_client_state_write_resumes_identically(tmp_path, scaffold_reference,
                                                                sig):
    """SIGKILL leaves a half .tmp file and the old versions; SIGTERM waits for the file to
    be whole, then stops the run as any SIGTERM does (143, run.json "interrupted"). Either
    way the resumed folder equals the uninterrupted run's, bit for bit."""
    want, writes = scaffold_reference
    assert writes == 5 * ROUNDS  # 5 clients a round, each writes its control variate
    for point in range(1, writes + 1):
        run_dir = tmp_path / f"state{point}"
        code = _in_child(lambda d=run_dir, p=point: _signalled_inside_state_write(p, sig)(d))
        trial = f"{signal.Signals(sig).name} inside client-state write {point} of {writes}"
        if sig == signal.SIGKILL:
            assert code == -signal.SIGKILL, trial
        else:
            assert code == sim.EXIT_TERMINATED, trial
            meta = json.loads((run_dir / "run.json").read_text())
            assert meta["status"] == "interrupted", trial
            assert not list(run_dir.rglob("*.tmp")), trial  # the write finished, or not at all
        assert _in_child(lambda d=run_dir: sim.run(_scaffold(d), progress=False)) == 0, trial
        _assert_same(_folder(run_dir), want, trial)
        assert _client_states(run_dir) == want["client_states"], trial
        assert not list(run_dir.rglob("*.tmp")), trial


def test_a_reader_that_leaves_stops_the_run_resumably(tmp_path):
    """`flnotes run ... | head -1`: the reader closes the pipe; the run stops as on Ctrl-C
    (folder interrupted, the resume line on stderr, exit 141 as SIGPIPE's, no traceback),
    never "failed"; the same command then resumes it to the uninterrupted run's folder."""
    command = [sys.executable, "-m", "flnotes", "run", "--dataset", "toy", "--rounds", "12",
               "--checkpoint-every", "1", "--run-dir"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    whole = tmp_path / "whole"
    subprocess.run([*command, str(whole)], check=True, capture_output=True, env=env)
    cut = tmp_path / "cut"
    reader = subprocess.Popen([*command, str(cut)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env)
    # The toy's note comes before any round (the first takes a second to set up): the
    # rounds' lines are written after the reader has left.
    assert reader.stdout.readline().startswith(b"toy task")
    reader.stdout.close()
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "interrupted after round" in err, err
    assert json.loads((cut / "run.json").read_text())["status"] == "interrupted"
    subprocess.run([*command, str(cut)], check=True, capture_output=True, env=env)
    _assert_same(_folder(cut), _folder(whole), "a reader that left, then resumed")


def test_a_reader_of_both_streams_that_leaves_still_gets_141(tmp_path):
    """`flnotes run ... 2>&1 | head -1`: the resume line cannot reach the closed stderr
    either; the run still stops as interrupted and the command still exits 141."""
    cut = tmp_path / "cut"
    reader = subprocess.Popen(
        [sys.executable, "-m", "flnotes", "run", "--dataset", "toy", "--rounds", "12",
         "--run-dir", str(cut)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert reader.stdout.readline().startswith(b"toy task")
    reader.stdout.close()
    assert reader.wait(timeout=120) == 141
    assert json.loads((cut / "run.json").read_text())["status"] == "interrupted"


def test_seeds_write_their_curves_before_a_reader_can_leave(tmp_path):
    """`flnotes run --seeds 0,1 ... | head -1`: the seeds finished; the curves are written
    before the summary is printed, and the command ends 0, with no traceback."""
    out = tmp_path / "seeds"
    done = subprocess.run(
        f"set -o pipefail; {sys.executable} -m flnotes run --dataset toy --rounds 3 "
        f"--seeds 0,1 --run-dir {out} | head -1", shell=True, capture_output=True,
        text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, executable="/bin/bash")
    assert done.stdout.startswith("seed 0: completed")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0  # every seed completed: the reader leaving changes nothing
    assert (out / "learning_curves.png").is_file()
