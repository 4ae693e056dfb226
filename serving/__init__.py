"""Online serving: the `get_features` SDK over Feast's Redis layout, and the HTTP feature server.

`from serving import OnlineClient` (or `AsyncOnlineClient`); importing `redis_store.layout` alone stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers see; at run time the names load on first use (below)
    from serving.client import AsyncOnlineClient, OnlineClient
    from serving.result import OnlineFeatures

__all__ = ["AsyncOnlineClient", "OnlineClient", "OnlineFeatures"]


def __getattr__(name: str) -> Any:
    if name in ("AsyncOnlineClient", "OnlineClient"):
        from serving import client

        return getattr(client, name)
    if name == "OnlineFeatures":
        from serving.result import OnlineFeatures

        return OnlineFeatures
    raise AttributeError(f"module 'serving' has no attribute {name!r}")
