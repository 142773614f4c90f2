"""Sweep cells as Ray tasks: ``python -m flnotes sweep GRID --executor ray [--address ADDR]``.

One Ray task per cell, each running :func:`flnotes.repro.sweep.run_cell` (papermill, the
same code as the local executor), so a cell's folder, ``cell.json`` and the sweep's
``summary.csv`` are the same whichever executor ran it. Without ``--address`` a local Ray
instance starts with ``--workers`` CPUs (so at most that many cells run at once) and stops
at the end; with one, the sweep joins a running cluster (``ray start --head`` on one machine,
``ray start --address HEAD:6379`` on the others) and the cluster's resources decide.

Every node writes into the sweep's output folder, so the folder (and the repository, whose
notebook the cells run) must be on a file system every node sees at the same path.

A cell asks for one GPU where the cluster has GPUs (Ray then sets CUDA_VISIBLE_DEVICES for
it) and one CPU otherwise. A cell that fails is recorded and the others go on, as locally.
Ctrl-C or SIGTERM cancels the cells still running (Ray kills their workers, and with them
the notebook kernels), waits a moment for them to end, records them ``interrupted`` (their
run folders resume on the next run) and keeps what finished.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

INSTALL_HINT = "--executor ray needs Ray: pip install 'flnotes[ray]'"


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return ray


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
               grace: float = 10.0) -> None:
    """Run ``run_cell(*job)`` for every job as a Ray task (the sweep's own cell function, so
    a cell runs exactly as locally); hand each finished record to ``on_record``.

    On KeyboardInterrupt (Ctrl-C; SIGTERM too where this process's handler makes it one, as
    the command line's does) every task not yet handed over is cancelled (its worker
    killed), given up to ``grace`` seconds to end, and its job passed to ``on_stop``; then
    the interrupt goes on up.
    """
    ray = _import_ray()
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    started_here = not ray.is_initialized()
    if started_here:
        options = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
        if address:
            try:
                ray.init(address=address, **options)
            except ConnectionError as err:
                raise ValueError(f"{err}: is the cluster running (ray start --head)? If it "
                                 "uses token authentication, set RAY_AUTH_MODE=token and "
                                 "RAY_AUTH_TOKEN (ray get-auth-token on the head) here "
                                 "too") from None
        else:
            ray.init(num_cpus=workers, num_gpus=0, **options)
    stops: list[BaseException] = []
    _route_sigterm(before, stops)
    try:
        gpus = ray.cluster_resources().get("GPU", 0)
        task = ray.remote(num_cpus=0 if gpus else 1, num_gpus=1 if gpus else 0,
                          max_retries=0)(run_cell)
        pending = {task.remote(*job): job for job in jobs}
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
