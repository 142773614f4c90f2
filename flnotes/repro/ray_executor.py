"""Sweep cells as Ray tasks: ``python -m flnotes sweep GRID --executor ray [--address ADDR]``.

One Ray task per cell, each running :func:`flnotes.repro.sweep.run_cell` (papermill, the
same code as the local executor), so a cell's folder, ``cell.json`` and the sweep's
``summary.csv`` are the same whichever executor ran it. Without ``--address`` a local Ray
instance starts (its resources below) and stops at the end; with one, the sweep joins a
running cluster (``ray start --head`` on one machine, ``ray start --address HEAD:6379`` on
the others) and the cluster's resources decide.

Every node writes into the sweep's output folder, so the folder (and the repository, whose
notebook the cells run) must be on a file system every node sees at the same path.

Each cell is one Ray task asking for ``--gpus-per-cell`` GPUs (default: 1 where the cluster
has GPUs, else 0; a fraction packs several cells on one GPU, e.g. 0.25 four small CNNs) and
``--cpus-per-cell`` CPUs (default 1). Ray picks the devices and sets CUDA_VISIBLE_DEVICES in
the task's worker; the task hands it on to the cell's notebook kernel explicitly (an empty
one with 0 GPUs: such a cell runs on the CPU, never on a GPU another cell holds), with
OMP_NUM_THREADS as its CPUs. A local instance (no ``--address``) sees this machine's GPUs
and gets ``--workers`` x ``--cpus-per-cell`` CPUs, so ``--workers`` cells run at once.

``--retries N``: a cell whose task dies with its worker or node (a Ray system error: a
preempted node, a killed worker; not an error in the notebook, which is recorded ``failed``
and never retried) runs again, up to N times, in the same cell folder: its run folders
resume from their last checkpoint. A cell that fails and a cell whose retries are spent are
recorded and the others go on, as locally. ``--address`` to a head nobody answers at fails
at once, in one line.

Ctrl-C or SIGTERM cancels the cells still running (Ray kills their workers, and with them
the notebook kernels), waits a moment for them to end, records them ``interrupted`` (their
run folders resume on the next run) and keeps what finished.
"""

from __future__ import annotations

import math
import signal
import socket
import threading
from collections.abc import Callable

from flnotes.repro.kernel import kernel_environment, release_kernel

INSTALL_HINT = "--executor ray needs Ray: pip install 'flnotes[ray]'"
NO_GPUS = "the Ray cluster has no GPUs; drop --gpus-per-cell"
CONNECT_TIMEOUT = 5.0  # seconds to wait for the head's port before giving up


def _import_ray():
    try:
        import ray  # optional: only with --executor ray
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return ray


def _amount(flag: str, value, whole: bool = False) -> float | int:
    """A flag's value as a number 0 or more (a string from the command line is parsed);
    a ValueError of one line otherwise. Ray takes fractions only below 1 (0.25 of a GPU,
    never 1.5), and ``whole`` ones only."""
    kind = "a whole number" if whole else "a number"
    bad = f"{flag} must be {kind} 0 or more, got {value!r}"
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ValueError(bad) from None
    if (isinstance(value, bool) or not math.isfinite(number) or number < 0
            or (whole and number != int(number))):
        raise ValueError(bad)
    if number > 1 and number != int(number):
        raise ValueError(f"{flag} takes a fraction only below 1 (Ray shares one device "
                         f"between cells, never splits several), got {value!r}")
    return int(number) if whole else number


def cell_options(gpus_per_cell=None, cpus_per_cell=1.0, retries=0) -> dict:
    """The checked ``--gpus-per-cell`` (None: decided by the cluster), ``--cpus-per-cell``
    and ``--retries``, as numbers; a ValueError of one line for a bad one."""
    return {"gpus_per_cell": None if gpus_per_cell is None
            else _amount("--gpus-per-cell", gpus_per_cell),
            "cpus_per_cell": _amount("--cpus-per-cell", cpus_per_cell),
            "retries": _amount("--retries", retries, whole=True)}


def _head(address: str) -> tuple[str, int] | None:
    """(host, port) of an ``--address`` to check before joining; None where Ray finds the
    head itself and none is recorded (``auto`` with no cluster started on this machine)."""
    if address in ("auto", "local"):
        try:
            from ray._private.services import canonicalize_bootstrap_address  # optional, as ray

            address = canonicalize_bootstrap_address(address) or ""
        except Exception:  # Ray's own lookup moved or failed: let ray.init say what it finds
            return None
    address = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """A ValueError of one line unless something answers at the head's port: ray.init to a
    dead head would print warnings for minutes before giving up."""
    head = _head(address)
    if head is None:
        return
    try:
        with socket.create_connection(head, timeout=timeout):
            pass
    except OSError as err:
        reason = err.strerror or ("timed out" if isinstance(err, TimeoutError) else str(err))
        raise ValueError(f"cannot reach the Ray head at {head[0]}:{head[1]}: {reason} (is "
                         "`ray start --head` running there, and the port open?)") from None


def _task_resources(ray, gpus_per_cell: float | None, cpus_per_cell: float) -> tuple:
    """(GPUs, CPUs) each cell's task asks for; a ValueError of one line where no node could
    ever run one (Ray would wait for it for ever)."""
    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus_per_cell is None:
        gpus_per_cell = 1 if gpus else 0
    elif gpus_per_cell and not gpus:
        raise ValueError(NO_GPUS)
    for amount, resource, flag in ((gpus_per_cell, "GPU", "--gpus-per-cell"),
                                   (cpus_per_cell, "CPU", "--cpus-per-cell")):
        # the most of the resource on one live node
        most = max((node.get("Resources", {}).get(resource, 0.0) for node in ray.nodes()
                    if node.get("Alive")), default=0.0)
        if amount > most:
            raise ValueError(f"no node of the Ray cluster has {amount:g} {resource}s (the "
                             f"most on one node is {most:g}); lower {flag}")
    return gpus_per_cell, cpus_per_cell


def _run_in_task(run_cell: Callable[..., dict], gpus: float, cpus: float, job: tuple) -> dict:
    """One cell inside its Ray task: the devices Ray gave the task (CUDA_VISIBLE_DEVICES in
    this worker) and its CPUs as threads, handed on to the notebook kernel explicitly (the
    kernel takes this process's environment), then the cell."""
    import ray  # optional: only with --executor ray

    ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
    threads = str(max(1, int(cpus)))
    env = {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
           # no GPU asked: none visible (Ray leaves the variable unset, which shows them all)
           "CUDA_VISIBLE_DEVICES": ",".join(ids) if gpus else ""}
    try:
        with kernel_environment(**env):  # restored after: a worker runs other tasks after this
            return run_cell(*job)
    finally:  # Ray ends its workers without their exit handlers: no kernelspec folder left
        release_kernel()


def _route_sigterm(before, stops: list) -> None:
    """Give SIGTERM back to ``before``, the handler this process had before ``ray.init`` put
    its own (exit at once, skipping the sweep's stop), and keep what ``before`` raises in
    ``stops``: Ray turns an exception raised in a handler while it waits into a plain
    KeyboardInterrupt, and the command line's exit status (143) needs the original."""
    if not callable(before):  # not the main thread, or no Python handler to give it back to
        return

    def handler(signum, frame):
        try:
            before(signum, frame)
        except BaseException as err:
            stops.append(err)
            raise

    signal.signal(signal.SIGTERM, handler)


def run_on_ray(run_cell: Callable[..., dict], jobs: list, workers: int, address: str | None,
               on_record: Callable[[dict], None],
               failed_record: Callable[[tuple, str], dict],
               on_stop: Callable[[tuple], None] = lambda job: None,
               grace: float = 10.0, gpus_per_cell: float | None = None,
               cpus_per_cell: float = 1.0, retries: int = 0) -> None:
    """Run ``run_cell(*job)`` for every job as a Ray task (the sweep's own cell function, so
    a cell runs exactly as locally) with ``gpus_per_cell`` GPUs (None: 1 where the cluster
    has GPUs, else 0) and ``cpus_per_cell`` CPUs; hand each finished record to
    ``on_record``. A task whose worker or node dies runs again up to ``retries`` times.

    On KeyboardInterrupt (Ctrl-C; SIGTERM too where this process's handler makes it one, as
    the command line's does) every task not yet handed over is cancelled (its worker
    killed), given up to ``grace`` seconds to end, and its job passed to ``on_stop``; then
    the interrupt goes on up.
    """
    options = cell_options(gpus_per_cell, cpus_per_cell, retries)
    ray = _import_ray()
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    started_here = not ray.is_initialized()
    if started_here:
        init = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if address:
            check_reachable(address)
            try:
                ray.init(address=address, **init)
            except ConnectionError as err:
                raise ValueError(f"{err}: is the cluster running (ray start --head)? If it "
                                 "uses token authentication, set RAY_AUTH_MODE=token and "
                                 "RAY_AUTH_TOKEN (ray get-auth-token on the head) here "
                                 "too") from None
        else:  # this machine's GPUs (Ray finds them), CPUs for --workers cells at once
            cpus = options["cpus_per_cell"]
            ray.init(num_cpus=max(1, math.ceil(workers * cpus)) if cpus else workers, **init)
    stops: list[BaseException] = []
    _route_sigterm(before, stops)
    try:
        gpus, cpus = _task_resources(ray, options["gpus_per_cell"], options["cpus_per_cell"])
        task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=options["retries"],
                          retry_exceptions=False)(_run_in_task)
        pending = {task.remote(run_cell, gpus, cpus, job): job for job in jobs}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    job = pending[ref]
                    try:
                        record = ray.get(ref)
                    except Exception as err:  # the task itself died (not a failed notebook)
                        record = failed_record(job, f"{type(err).__name__}: {err}")
                    on_record(record)
                    del pending[ref]  # only once recorded: an interrupt before is a stop
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref, force=True)
            # Let the cancellations land, so no cell's kernel is still writing when the
            # sweep records it and exits (a cluster's workers outlive this driver).
            if pending:  # an interrupt after the last record leaves nothing to wait for
                ray.wait(list(pending), num_returns=len(pending), timeout=grace)
            for job in pending.values():
                on_stop(job)
            if stops:  # SIGTERM: go on up as what the process's own handler raised
                raise stops[0] from None
            raise
    finally:
        if started_here:
            ray.shutdown()
        if before is not None:
            signal.signal(signal.SIGTERM, before)
