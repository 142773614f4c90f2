"""flnotes: learn and reproduce federated learning methods that seek flat minima."""

from flnotes.config import RunConfig
from flnotes.engine.history import History
from flnotes.engine.seeds import run_seeds
from flnotes.engine.sim import run

__version__ = "0.1.0"
__all__ = ["History", "RunConfig", "run", "run_seeds", "__version__"]
