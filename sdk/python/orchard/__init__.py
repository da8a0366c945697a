"""Orchard's Python client (standard library only; see client.py) and a
Gymnasium-style environment over its episodes (env.py)."""

from .client import (AsyncClient, Browser, Client, Desktop, Episode, Image, OrchardError, Sandbox,
                     ServiceEndpoint, screenshot_bytes)
from .env import ActionSpace, ObservationSpace, OrchardEnv, Trajectory, Transition, close_all, run_batch, run_batch_async

__version__ = "0.2.0"

__all__ = ["Client", "AsyncClient", "Sandbox", "Browser", "Desktop", "Episode", "Image", "OrchardError", "ServiceEndpoint",
           "screenshot_bytes", "OrchardEnv", "ActionSpace", "ObservationSpace", "Trajectory", "Transition", "run_batch",
           "run_batch_async", "close_all"]
