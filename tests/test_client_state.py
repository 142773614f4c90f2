"""The per-client state store, and runs of its users (SCAFFOLD, FedDyn) that stop and resume."""

import pytest
import torch
from conftest import DEVICE

from flnotes.config import RunConfig
from flnotes.engine.client_state import ClientStateStore
from flnotes.engine.sim import run, sample_clients
from flnotes.engine.state import states_allclose


def zeros(client):
    return {"w": torch.zeros(3), "b": torch.zeros(())}


def state(value):
    return {"w": torch.full((3,), float(value)), "b": torch.tensor(float(-value))}


def same(a, b):
    return set(a) == set(b) and all(torch.equal(a[n], b[n]) for n in a)


@pytest.fixture(params=["disk", "memory"])
def store(request, tmp_path):
    return ClientStateStore(tmp_path / "states" if request.param == "disk" else None, zeros)


def test_new_clients_start_from_the_factory_and_reach_disk_only_when_put(tmp_path):
    store = ClientStateStore(tmp_path / "s", zeros)
    (held,) = store.hold([7])
    assert same(held, zeros(7))
    assert store.disk_bytes() == 0 and store.known_clients() == []
    store.put(7, state(1), round=1)
    assert store.known_clients() == [7] and len(list((tmp_path / "s").iterdir())) == 1


def test_unsampled_clients_survive_unchanged(store):
    store.hold(range(5))
    for c in range(5):
        store.put(c, state(c), round=1)
    store.release()
    for rnd, sampled in [(2, [1, 3]), (3, [3, 4]), (4, [1])]:
        store.hold(sampled)
        for c in sampled:
            store.put(c, state(10 * rnd + c), round=rnd)
        store.release()
    expected = {0: state(0), 1: state(41), 2: state(2), 3: state(33), 4: state(34)}
    for c, s in zip(range(5), store.hold(range(5)), strict=True):
        assert same(s, expected[c]), c


def test_memory_holds_only_the_rounds_clients(tmp_path):
    store = ClientStateStore(tmp_path / "s", zeros)
    store.hold([1, 2])
    store.put(1, state(1), 1)
    store.put(2, state(2), 1)
    assert store.held_clients() == [1, 2]
    assert store.held_bytes() == 2 * 4 * 4  # two states of 4 float32 numbers
    store.release()
    assert store.held_clients() == [] and store.held_bytes() == 0
    store.hold([2, 5])
    assert store.held_clients() == [2, 5]
    with pytest.raises(KeyError):
        store.get(1)  # not this round's: on disk only


def test_a_crash_while_writing_leaves_the_old_state_readable(tmp_path, monkeypatch):
    store = ClientStateStore(tmp_path / "s", zeros)
    store.hold([3])
    store.put(3, state(1), round=1)
    checkpoint = store.state_dict()
    real_save = torch.save

    def dies_halfway(obj, f, *args, **kwargs):
        f.write(b"half a file")
        raise OSError("simulated kill during the write")

    monkeypatch.setattr(torch, "save", dies_halfway)
    store.hold([3])
    with pytest.raises(OSError):
        store.put(3, state(2), round=2)
    monkeypatch.setattr(torch, "save", real_save)
    store.release()
    assert same(store.hold([3])[0], state(1))  # the store still names the old version
    fresh = ClientStateStore(tmp_path / "s", zeros)  # a new process resuming the checkpoint
    fresh.load_state_dict(checkpoint)
    assert same(fresh.hold([3])[0], state(1))
    fresh.state_dict()  # the next checkpoint removes the half-written file
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["client0000003.round0000001.pt"]


def test_state_dict_returns_to_the_states_as_of_the_checkpoint(store, tmp_path):
    store.hold([0, 1])
    store.put(0, state(1), 1)
    store.put(1, state(2), 1)
    store.release()
    checkpoint = store.state_dict()
    store.hold([1, 2])  # rounds after the checkpoint, then the run dies
    store.put(1, state(3), 2)
    store.put(2, state(4), 2)
    store.release()
    resumed = ClientStateStore(store.directory, zeros)
    resumed.load_state_dict(checkpoint)
    s0, s1, s2 = resumed.hold([0, 1, 2])
    assert same(s0, state(1)) and same(s1, state(2)) and same(s2, zeros(2))


def test_files_are_pruned_only_when_no_checkpoint_on_disk_can_name_them(tmp_path):
    store = ClientStateStore(tmp_path / "s", zeros)
    names = lambda: sorted(p.name for p in (tmp_path / "s").iterdir())  # noqa: E731
    store.hold([0])
    store.put(0, state(1), 1)
    first = store.state_dict()  # checkpoint A names round 1
    store.hold([0])
    store.put(0, state(2), 2)
    store.state_dict()  # checkpoint B: until B replaces A on disk, round 1 must stay
    assert names() == ["client0000000.round0000001.pt", "client0000000.round0000002.pt"]
    restored = ClientStateStore(tmp_path / "s", zeros)
    restored.load_state_dict(first)  # as if B's write had died
    assert same(restored.hold([0])[0], state(1))
    store.hold([0])
    store.put(0, state(3), 3)
    store.state_dict()  # checkpoint C: A can no longer be the file on disk
    assert names() == ["client0000000.round0000002.pt", "client0000000.round0000003.pt"]


def test_putting_an_older_round_is_refused(tmp_path):
    store = ClientStateStore(tmp_path / "s", zeros)
    store.hold([0])
    store.put(0, state(1), 5)
    with pytest.raises(ValueError, match="round 5"):
        store.put(0, state(1), 4)


# ---- runs of the methods that keep per-client state --------------------------------------
METHODS = {"scaffold": {"momentum": 0.0}, "feddyn": {"feddyn_alpha": 0.1}}


def method_config(tiny_config, name):
    # 6 clients, 2 a round: over 6 rounds clients are sampled, skipped and sampled again.
    return tiny_config.replace(algorithm=name, clients_per_round=2, rounds=6,
                               checkpoint_every=2, **METHODS[name])


def test_the_resume_configs_sample_skip_and_resample_clients(tiny_config):
    config = method_config(tiny_config, "scaffold")
    rounds = [set(sample_clients(config, r)) for r in range(1, 7)]
    returning = [c for c in range(6)
                 if any(c in rounds[a] and c not in rounds[b] and c in rounds[d]
                        for a in range(6) for b in range(a + 1, 6) for d in range(b + 1, 6))]
    assert returning  # some client is sampled, skipped, then sampled again


@pytest.mark.parametrize("name", list(METHODS))
def test_resume_after_a_kill_equals_the_uninterrupted_run(tiny_config, tmp_path, monkeypatch,
                                                          name):
    """Killed in round 5 with a checkpoint at round 4 (states of round 5's clients on disk)."""
    import flnotes.engine.sim as sim

    config = method_config(tiny_config, name)
    full = run(config.replace(run_dir=str(tmp_path / "full")), progress=False)
    in_memory = run(config, progress=False)  # no run folder: the in-memory store
    assert states_allclose(full.final_state, in_memory.final_state, rtol=0, atol=0)

    # A shorter run first (its last round is checkpointed), then a kill mid-way.
    folder = str(tmp_path / "killed")
    run(config.replace(rounds=3, run_dir=folder), progress=False)
    real_train = sim.train_clients
    calls = []

    def killed_after_round_5_trains(task, strategy, rnd, *args):
        results = real_train(task, strategy, rnd, *args)
        if rnd == 6:
            raise KeyboardInterrupt("simulated kill")
        calls.append(rnd)
        return results

    monkeypatch.setattr(sim, "train_clients", killed_after_round_5_trains)
    with pytest.raises(KeyboardInterrupt):
        run(config.replace(run_dir=folder), progress=False)
    assert calls == [4, 5]  # round 5 wrote client states after the checkpoint of round 4
    monkeypatch.setattr(sim, "train_clients", real_train)
    resumed = run(config.replace(run_dir=folder), progress=False)
    assert states_allclose(full.final_state, resumed.final_state, rtol=0, atol=0)
    assert [r["accuracy"] for r in full.rows] == [r["accuracy"] for r in resumed.rows]


@pytest.mark.parametrize("name", list(METHODS))
def test_vmap_backend_equals_the_loop(tiny_config, name):
    config = method_config(tiny_config, name).replace(rounds=4)
    loop = run(config.replace(backend="loop"), progress=False)
    fast = run(config.replace(backend="vmap"), progress=False)
    assert states_allclose(loop.final_state, fast.final_state, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(METHODS))
def test_runs_on_the_toy(name):
    config = RunConfig(algorithm=name, dataset="toy", num_clients=4, clients_per_round=2,
                       rounds=4, lr=0.05, momentum=0.0, batch_size=10, device=DEVICE)
    history = run(config, progress=False)
    assert history.status == "completed" and len(history.rows) == 4
    assert all(torch.isfinite(t).all() for t in history.final_state.values())


# ---- the files' integrity -------------------------------------------------------
def _two_clients(directory, settings="run-a"):
    """A store with clients 0 and 1 written in round 1, and its checkpoint record."""
    store = ClientStateStore(directory, zeros)
    store.settings_hash = settings
    store.hold([0, 1])
    store.put(0, state(1), 1)
    store.put(1, state(2), 1)
    store.release()
    return store, store.state_dict()


def _resume(directory, checkpoint, settings="run-a"):
    store = ClientStateStore(directory, zeros)
    store.settings_hash = settings
    store.load_state_dict(checkpoint)
    return store


def test_files_carry_their_client_round_and_run_and_the_checkpoint_their_digest(tmp_path):
    import hashlib

    _, checkpoint = _two_clients(tmp_path / "s")
    path = tmp_path / "s" / "client0000001.round0000001.pt"
    record = torch.load(path, weights_only=True)
    assert (record["client"], record["round"], record["settings_hash"]) == (1, 1, "run-a")
    assert same(record["state"], state(2))
    assert checkpoint["versions"] == {0: 1, 1: 1}
    assert checkpoint["digests"][1] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert same(_resume(tmp_path / "s", checkpoint).hold([1])[0], state(2))


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _foreign(directory):
    """Client 1's file of round 1 from another run (other settings), in its place."""
    other, _ = _two_clients(directory.parent / "other", settings="run-b")
    name = "client0000001.round0000001.pt"
    (directory / name).write_bytes((other.directory / name).read_bytes())


def _swap(directory):
    a, b = directory / "client0000000.round0000001.pt", directory / "client0000001.round0000001.pt"
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


DAMAGE = {
    "missing": (lambda d: (d / "client0000001.round0000001.pt").unlink(), "is missing"),
    "empty": (lambda d: (d / "client0000001.round0000001.pt").write_bytes(b""),
              "is damaged and cannot be read"),
    "garbage": (lambda d: (d / "client0000001.round0000001.pt").write_bytes(b"garbage" * 9),
                "is damaged and cannot be read"),
    "truncated": (lambda d: (d / "client0000001.round0000001.pt").write_bytes(
        (d / "client0000001.round0000001.pt").read_bytes()[:200]), "is damaged"),
    "a byte flipped": (lambda d: _flip_a_byte(d / "client0000001.round0000001.pt"),
                       "is damaged"),
    "foreign": (_foreign, "belongs to another run"),
    "swapped": (_swap, "(a swapped or renamed file)"),
    "not a state": (lambda d: torch.save({"x": 1}, d / "client0000001.round0000001.pt"),
                    "is damaged (not a client-state file)"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_resume_refuses_a_bad_file_in_one_line_naming_it(tmp_path, damage):
    from flnotes.engine.client_state import ClientStateError

    _, checkpoint = _two_clients(tmp_path / "s")
    make, expected = DAMAGE[damage]
    make(tmp_path / "s")
    with pytest.raises(ClientStateError) as err:
        _resume(tmp_path / "s", checkpoint)
    message = str(err.value)
    assert "\n" not in message and expected in message, message
    named = "client0000000.round0000001.pt" if damage == "swapped" else \
        "client0000001.round0000001.pt"
    assert str(tmp_path / "s" / named) in message and "delete the run folder" in message


def test_a_file_damaged_during_the_run_is_one_line_when_read(tmp_path):
    from flnotes.engine.client_state import ClientStateError

    store, _ = _two_clients(tmp_path / "s")
    _flip_a_byte(tmp_path / "s" / "client0000000.round0000001.pt")
    with pytest.raises(ClientStateError, match=r"^[^\n]*client0000000\.round0000001\.pt is "
                                                r"damaged"):
        store.hold([0])


def test_checkpoints_from_before_the_digests_still_resume(tmp_path):
    """A folder written before the digests: plain state files, a record of versions only."""
    from flnotes.engine.client_state import ClientStateError

    folder = tmp_path / "s"
    folder.mkdir()
    torch.save(state(5), folder / "client0000002.round0000003.pt")
    store = _resume(folder, {"versions": {2: 3}})
    assert same(store.hold([2])[0], state(5))
    (folder / "client0000002.round0000003.pt").write_bytes(b"oops")
    with pytest.raises(ClientStateError, match="cannot be read"):
        _resume(folder, {"versions": {2: 3}})


def test_a_full_disk_leaves_no_tmp_file_and_the_old_version(tmp_path, monkeypatch):
    import errno

    from flnotes.engine import client_state

    store, checkpoint = _two_clients(tmp_path / "s")
    real = client_state.write_atomically

    def disk_full(path, write):
        def half_then_full(f):
            f.write(b"half")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, half_then_full)

    monkeypatch.setattr(client_state, "write_atomically", disk_full)
    store.hold([0])
    with pytest.raises(OSError, match="No space left on device"):
        store.put(0, state(9), 2)
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "client0000000.round0000001.pt", "client0000001.round0000001.pt"]
    monkeypatch.setattr(client_state, "write_atomically", real)
    store.release()
    assert same(store.hold([0])[0], state(1))  # still round 1's
    assert same(_resume(tmp_path / "s", checkpoint).hold([0])[0], state(1))


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_during_a_write_waits_for_the_file(tmp_path, monkeypatch, sig):
    """The signal lands halfway through torch.save (which, cut there, would raise
    'RuntimeError: ... unexpected pos'): the file is written whole, then the interrupt."""
    import os
    import signal

    from flnotes.engine.sim import Terminated, terminate_like_ctrl_c

    store, _ = _two_clients(tmp_path / "s")
    real_save = torch.save
    signum = getattr(signal, sig)

    def signalled_save(obj, f, *args, **kwargs):
        os.kill(os.getpid(), signum)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", signalled_save)
    store.hold([0])
    with terminate_like_ctrl_c(), pytest.raises(KeyboardInterrupt) as stop:
        store.put(0, state(7), 2)
    assert isinstance(stop.value, Terminated) == (sig == "SIGTERM")
    monkeypatch.setattr(torch, "save", real_save)
    assert not list((tmp_path / "s").glob("*.tmp"))
    written = torch.load(tmp_path / "s" / "client0000000.round0000002.pt", weights_only=True)
    assert same(written["state"], state(7))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_deferred_signals_hold_and_deliver_once(monkeypatch):
    import os
    import signal

    from flnotes.engine.client_state import deferred_signals

    done = []
    with pytest.raises(KeyboardInterrupt), deferred_signals():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        done.append("the block ran to its end")
    assert done == ["the block ran to its end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
