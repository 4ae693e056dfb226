"""Shadow runs of the challenger: how its answers compare with the champion's on the same requests.

A shadow copy is made after the champion answered; its result is compared and dropped, never returned. Recorded:
its latency (arrival of the copy to its mesh), the share of shape tokens equal to the champion's at the same
positions, and the mesh differences: the largest gap between the two axis-aligned bounding boxes (the same units
as the mesh, which spans [-1.05, 1.05]) and the volume difference relative to the champion's mesh.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from inference.service.metrics import histogram_buckets
from serving.stats import LatencyHistogram

SHADOW_OUTCOMES = ("compared", "failed", "dropped")   # dropped: the challenger's queue was full


@dataclass(frozen=True)
class Agreement:
    tokens: float          # share of positions with the same token, 0..1
    bbox: float            # largest absolute difference of the six bounding-box coordinates
    volume: float          # |challenger volume - champion volume| / champion volume


def token_agreement(champion: Sequence[int], challenger: Sequence[int]) -> float:
    length = max(len(champion), len(challenger))
    if not length:
        return 1.0
    return sum(a == b for a, b in zip(champion, challenger)) / length


def _mesh(glb: bytes):
    import trimesh

    return trimesh.load(trimesh.util.wrap_as_stream(glb), file_type="glb", force="mesh")


def agreement(champion_tokens: Sequence[int], champion_glb: bytes, challenger_tokens: Sequence[int],
              challenger_glb: bytes) -> Agreement:
    a, b = _mesh(champion_glb), _mesh(challenger_glb)
    bbox = float(abs(a.bounds - b.bounds).max())
    volume = abs(abs(b.volume) - abs(a.volume)) / max(abs(a.volume), 1e-12)
    return Agreement(token_agreement(champion_tokens, challenger_tokens), bbox, float(volume))


class ShadowStats:
    """Per challenger version: outcomes, latency, and sums of the agreement measures (means in /metrics)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_version: dict[str, dict] = {}

    def _row(self, version: str) -> dict:
        return self._by_version.setdefault(version, {"outcomes": dict.fromkeys(SHADOW_OUTCOMES, 0),
                                                     "latency": LatencyHistogram(), "tokens": 0.0, "bbox": 0.0,
                                                     "volume": 0.0})

    def count(self, version: str, outcome: str) -> None:
        with self._lock:
            self._row(version)["outcomes"][outcome] += 1

    def compared(self, version: str, latency_s: float, measured: Agreement) -> None:
        with self._lock:
            row = self._row(version)
            row["outcomes"]["compared"] += 1
            row["latency"].record_ns(int(latency_s * 1e9))
            row["tokens"] += measured.tokens
            row["bbox"] += measured.bbox
            row["volume"] += measured.volume

    def summary(self) -> dict:
        """{version: {outcomes, p50_ms, p99_ms, token_agreement, bbox_difference, volume_difference}}."""
        out = {}
        with self._lock:
            for version, row in self._by_version.items():
                n = max(1, row["outcomes"]["compared"])
                percentiles = {f"{k}_ms": v for k, v in row["latency"].percentiles_ms().items()}
                out[version] = {"outcomes": dict(row["outcomes"]), **percentiles,
                                "token_agreement": row["tokens"] / n, "bbox_difference": row["bbox"] / n,
                                "volume_difference": row["volume"] / n}
        return out

    def collect(self) -> Iterator[Metric]:
        outcomes = CounterMetricFamily("cube3d_shadow_requests", "shadow copies run on the challenger, by outcome",
                                       labels=["version", "outcome"])
        latency = HistogramMetricFamily("cube3d_shadow_duration_seconds", "shadow copy latency, arrival to mesh",
                                        labels=["version"])
        means = {name: GaugeMetricFamily(f"cube3d_shadow_{name}", text, labels=["version"]) for name, text in (
            ("token_agreement", "mean share of shape tokens equal to the champion's"),
            ("bbox_difference", "mean largest bounding-box coordinate difference from the champion's mesh"),
            ("volume_difference", "mean volume difference relative to the champion's mesh"))}
        with self._lock:
            for version, row in self._by_version.items():
                for name, n in row["outcomes"].items():
                    outcomes.add_metric([version, name], n)
                h = row["latency"]
                latency.add_metric([version], histogram_buckets(h), h.sum_us / 1e6)
                n = max(1, row["outcomes"]["compared"])
                for name, key in (("token_agreement", "tokens"), ("bbox_difference", "bbox"),
                                  ("volume_difference", "volume")):
                    means[name].add_metric([version], row[key] / n)
        yield from (outcomes, latency, *means.values())
