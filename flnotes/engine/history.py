"""History: what a run produced (per-round metrics, status, config, environment)."""

from __future__ import annotations

import functools
import json
import platform
import subprocess
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

# "interrupted": stopped by Ctrl-C (KeyboardInterrupt); running the config again resumes it.
STATUSES = ("running", "completed", "diverged", "interrupted")


@dataclass
class History:
    """Per-round metrics and the facts needed to trust and redo a run."""

    config: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    status: str = "running"
    environment: dict[str, Any] = field(default_factory=dict)
    code_version: str = ""
    run_dir: str | None = None
    # Only with config.record_states: per round {"round", "dispatched", "local", "global"}.
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    final_state: dict[str, torch.Tensor] | None = None

    def metric(self, name: str) -> list[float]:
        """Values of one metric over the rounds where it was recorded."""
        return [row[name] for row in self.rows if name in row]

    def rounds_of(self, name: str) -> list[int]:
        """Rounds at which a metric was recorded."""
        return [row["round"] for row in self.rows if name in row]

    @property
    def final_accuracy(self) -> float | None:
        """Accuracy of the last evaluation, or None if never evaluated."""
        values = self.metric("accuracy")
        return values[-1] if values else None

    def to_frame(self):
        """Rows as a pandas DataFrame (one row per round)."""
        import pandas as pd  # lazy: pandas costs ~0.35 s, runs need none

        frame = pd.DataFrame(self.rows)
        frame["algorithm"] = self.config.get("algorithm")
        return frame

    def summary(self) -> dict[str, Any]:
        """The JSON-able part: everything but states."""
        return {"config": self.config, "status": self.status, "rows": self.rows,
                "environment": self.environment, "code_version": self.code_version,
                "run_dir": self.run_dir}

    @classmethod
    def load(cls, run_dir: str | Path) -> History:
        """Read a run folder written by :func:`flnotes.engine.sim.run`."""
        run_dir = Path(run_dir)
        meta = read_run_json(run_dir / "run.json")
        rows = read_metrics(run_dir / "metrics.jsonl")
        final = None
        model = run_dir / "global_model.pt"
        if model.exists():
            try:
                # On the CPU, whatever device wrote it: a GPU run's folder opens anywhere.
                final = torch.load(model, map_location="cpu", weights_only=True)
            except Exception as err:  # truncated or garbage: torch raises many kinds
                raise ValueError(f"{model} is damaged and cannot be read "
                                 f"({type(err).__name__}); run the same config on the folder "
                                 "again to rebuild it from the checkpoint") from None
        return cls(config=meta["config"], rows=rows, status=meta["status"],
                   environment=meta.get("environment", {}), final_state=final,
                   code_version=meta.get("code_version", ""), run_dir=str(run_dir))


def read_run_json(path: Path) -> dict[str, Any]:
    """A run folder's run.json; ValueError naming the file if it is not what run() writes."""
    try:
        meta = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is damaged (not JSON: {err})") from None
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict) \
            or not isinstance(meta.get("status"), str):
        raise ValueError(f"{path} is damaged (not a run's record: no config or status)")
    return meta


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's rows; ValueError naming the file and line of a row that is not JSON.

    A half-written last line (a run killed mid-write) is left out: the next run of the
    folder rewrites the file from its checkpoint.
    """
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise ValueError(f"{path} is damaged: line {number} is not JSON ({err})") from None
        if not isinstance(row, dict) or "round" not in row:
            raise ValueError(f"{path} is damaged: line {number} is not a round's metrics")
        rows.append(row)
    return rows


def environment_info(device: torch.device) -> dict[str, Any]:
    """Versions and hardware a run used."""
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "device": str(device),
            "cpu_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        # TF32 rounds convolution and matmul inputs to 10 mantissa bits: results (and how
        # closely the loop and vmap backends agree, ~1e-3 instead of ~1e-6) depend on it.
        info["tf32_conv"] = bool(torch.backends.cudnn.allow_tf32)
        info["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return info


@functools.lru_cache(maxsize=1)  # one git call per process, not one per run
def code_version() -> str:
    """Git commit of the flnotes checkout (with -dirty), or the package version."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=12"],
                             cwd=here, capture_output=True, text=True, timeout=5)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return "flnotes " + version("flnotes")
    except PackageNotFoundError:
        return "unknown"
