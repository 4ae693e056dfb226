"""Asset features -> condition: the bbox token as v0.5 builds it, and a zero-initialized asset embedding.

A request may name an asset ("regenerate this asset as a wooden version"). Its features come from the online
store through the serving SDK (feature service `cube3d_conditioning`), one pipelined round trip per batch:
- the bounding box (`bbox_x/y/z`) becomes v0.5's bbox condition token through the released `bbox_proj`, scaled
  the way the released inference does (longest side = 1.925). v0.1 has no bbox token; there the bbox only enters
  the asset embedding below.
- everything the service knows about the asset (bbox, category, style, popularity: views/likes/unique users over
  24 h) becomes a fixed-length vector (`asset_vector`) that `AssetProjection`, a Linear(40 -> width) initialized
  to zero, maps to an embedding added to every condition token. Zero weights add exactly zero, so the released
  behaviour is unchanged (tokens identical, tested) until the projection is trained and loaded. It is added
  rather than appended as extra tokens on purpose: an appended token always takes attention mass (its key goes
  through RMSNorm, so no input makes it vanish), which would change the released outputs even with zero weights.
- fallbacks, never failures: an unknown asset, features older than the view's ttl, a NULL or degenerate bbox,
  or an unreachable store give the zero bbox (what the unconditional row uses) and a zero asset vector part;
  each is logged and counted by reason (`FALLBACK_REASONS`).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from common.errors import FeaturectlError

log = logging.getLogger(__name__)

BBOX = ("bbox_x", "bbox_y", "bbox_z")
POPULARITY = ("views_24h", "likes_24h", "unique_users_24h")
CATEGORY_BUCKETS = STYLE_BUCKETS = 16
ASSET_VECTOR_DIM = 3 + 1 + CATEGORY_BUCKETS + STYLE_BUCKETS + len(POPULARITY) + 1     # 40
FALLBACK_REASONS = ("missing_asset", "stale_features", "no_bbox", "store_unavailable")
PRESENT, NOT_FOUND, OUTSIDE_MAX_AGE = "PRESENT", "NOT_FOUND", "OUTSIDE_MAX_AGE"
_RECONNECT_S = 30.0


@dataclass(frozen=True)
class AssetFeatures:
    """One asset's conditioning features as fetched; `fallback` names why a part was replaced (None: all used)."""

    asset_id: str
    bbox: tuple[float, float, float] | None = None       # raw sides, as stored
    category: str | None = None
    style: str | None = None
    popularity: dict[str, float] = field(default_factory=dict)
    fallback: str | None = None


def bbox_condition(bbox: tuple[float, float, float] | None, max_size: float) -> Tensor:
    """The bbox input of `bbox_proj` [3]: sides scaled so the longest is `max_size`; zeros without a bbox."""
    if bbox is None:
        return torch.zeros(3)
    sides = torch.tensor(bbox, dtype=torch.float32)
    return sides * (max_size / float(sides.max()))


def _bucket(value: str | None, buckets: int) -> Tensor:
    out = torch.zeros(buckets)
    if value:
        out[zlib.crc32(value.encode()) % buckets] = 1.0          # stable across processes, unlike hash()
    return out


def asset_vector(features: AssetFeatures | None, max_size: float) -> Tensor:
    """[ASSET_VECTOR_DIM]: scaled bbox, has-bbox, category and style one-hot (hashed), log1p popularity, has-it."""
    if features is None:
        return torch.zeros(ASSET_VECTOR_DIM)
    has_bbox = torch.tensor([float(features.bbox is not None)])
    pop = [math.log1p(max(0.0, features.popularity.get(name, 0.0))) for name in POPULARITY]
    has_pop = torch.tensor([float(bool(features.popularity))])
    parts = [bbox_condition(features.bbox, max_size), has_bbox, _bucket(features.category, CATEGORY_BUCKETS),
             _bucket(features.style, STYLE_BUCKETS), torch.tensor(pop), has_pop]
    return torch.cat(parts)


class AssetProjection(nn.Module):
    """Asset vector [B, 40] -> embedding [B, width] added to every condition token; zero until trained."""

    def __init__(self, width: int):
        super().__init__()
        self.asset_proj = nn.Linear(ASSET_VECTOR_DIM, width)
        nn.init.zeros_(self.asset_proj.weight)
        nn.init.zeros_(self.asset_proj.bias)

    def forward(self, vectors: Tensor) -> Tensor:
        return self.asset_proj(vectors)

    def load(self, path: str | Path) -> None:
        """Trained weights (`asset_proj.weight`, `asset_proj.bias`), loaded strictly."""
        from inference.checkpoint import load_safetensors

        load_safetensors(self, path)


def _bbox_of(values: dict[str, list], row: int) -> tuple[float, float, float] | None:
    sides = [values[name][row] for name in BBOX]
    if any(v is None or not math.isfinite(v) or v <= 0 for v in sides):
        return None
    return (float(sides[0]), float(sides[1]), float(sides[2]))


def parse_response(response: Any, asset_ids: Sequence[str]) -> list[AssetFeatures]:
    """`OnlineFeatures` of the conditioning service -> one `AssetFeatures` per asset, fallbacks decided here."""
    values = response.values
    bbox_status = response.rows_of[BBOX[0]].statuses(values[BBOX[0]])
    pop_status = response.rows_of[POPULARITY[0]].statuses(values[POPULARITY[0]])
    out = []
    for i, asset_id in enumerate(asset_ids):
        status = bbox_status[i]
        bbox = _bbox_of(values, i) if status == PRESENT else None
        reason = {NOT_FOUND: "missing_asset", OUTSIDE_MAX_AGE: "stale_features"}.get(status)
        if reason is None and bbox is None:
            reason = "no_bbox"
        attrs_ok = status == PRESENT
        popularity = ({n: float(values[n][i] or 0) for n in POPULARITY} if pop_status[i] == PRESENT else {})
        out.append(AssetFeatures(asset_id, bbox, values["category"][i] if attrs_ok else None,
                                 values["style"][i] if attrs_ok else None, popularity, reason))
    return out


class AssetFeatureFetcher:
    """Features of a batch's assets in one SDK call; never raises: the store's trouble becomes a fallback.

    `make_client` builds a serving `OnlineClient` (it reads the registry); if that fails the fetcher retries at
    most every 30 s and meanwhile answers with fallbacks.
    """

    def __init__(self, make_client: Callable[[], Any] | None, service: str = "cube3d_conditioning"):
        self.make_client = make_client
        self.service = service
        self.client: Any = None
        self.fallbacks = {reason: 0 for reason in FALLBACK_REASONS}
        self._lock = threading.Lock()
        self._tried_at = -math.inf

    def connect(self) -> Any:
        """The SDK client, built now if it is not yet (and not tried in the last 30 s); None while unavailable."""
        if self.client is None and self.make_client is not None and time.monotonic() - self._tried_at > _RECONNECT_S:
            self._tried_at = time.monotonic()
            try:
                self.client = self.make_client()
            except Exception as exc:  # registry unreadable, bad settings: generation goes on without features
                log.error("feature store unavailable (%s); asset requests fall back to no asset features", exc)
        return self.client

    def fetch(self, asset_ids: Sequence[str]) -> list[AssetFeatures]:
        """One `AssetFeatures` per id, in order."""
        if not asset_ids:
            return []
        client = self.connect()
        if client is None:
            found = [AssetFeatures(a, fallback="store_unavailable") for a in asset_ids]
        else:
            try:
                response = client.get_online_features(self.service, {"asset_id": list(asset_ids)})
                found = parse_response(response, asset_ids)
            except FeaturectlError as exc:  # any error the SDK reports: Redis away, a refused read, a bad plan
                log.warning("feature fetch failed (%s); %d request(s) fall back", exc, len(asset_ids))
                found = [AssetFeatures(a, fallback="store_unavailable") for a in asset_ids]
        self._count(found)
        return found

    def _count(self, found: list[AssetFeatures]) -> None:
        for features in found:
            if features.fallback:
                log.warning("asset `%s`: %s, conditioning on the zero bbox", features.asset_id, features.fallback)
                with self._lock:
                    self.fallbacks[features.fallback] += 1

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


def online_store(repo: str | Path, registry: str | None = None, timeout_s: float = 0.05) -> Callable[[], Any]:
    """What `GenerationService(make_client=...)` takes: builds the serving SDK's client for a feature repo."""
    def make_client() -> Any:
        from serving import OnlineClient

        return OnlineClient.from_repo(repo, registry=registry, timeout_s=timeout_s)

    return make_client
