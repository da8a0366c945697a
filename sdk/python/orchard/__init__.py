"""Orchard's Python client (standard library only); see client.py."""

from .client import (AsyncClient, Browser, Client, Desktop, Episode, Image, OrchardError, Sandbox,
                     ServiceEndpoint, screenshot_bytes)

__all__ = ["Client", "AsyncClient", "Sandbox", "Browser", "Desktop", "Episode", "Image", "OrchardError", "ServiceEndpoint",
           "screenshot_bytes"]
