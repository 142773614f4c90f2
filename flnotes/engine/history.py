"""History: what a run produced (per-round metrics, status, config, environment)."""

from __future__ import annotations

import functools
import json
import platform
import subprocess
from dataclasses import dataclass, field
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
        import pandas as pd

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
        meta = json.loads((run_dir / "run.json").read_text())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                if line.strip()]
        final = None
        if (run_dir / "global_model.pt").exists():
            # On the CPU, whatever device wrote it: a GPU run's folder opens anywhere.
            final = torch.load(run_dir / "global_model.pt", map_location="cpu", weights_only=True)
        return cls(config=meta["config"], rows=rows, status=meta["status"],
                   environment=meta.get("environment", {}),
                   code_version=meta.get("code_version", ""), run_dir=str(run_dir),
                   final_state=final)


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
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "flnotes " + version("flnotes")
    except PackageNotFoundError:
        return "unknown"
