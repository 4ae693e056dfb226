"""Serving registered model versions (`models:/NAME@champion`): switched without a restart, A/B split, shadow.

A thread polls the registry's aliases every `poll_s`. When `champion` (or `challenger`, with A/B or shadow on)
points at another version, that version's service is built and warmed up (its CUDA graphs captured on a GPU) while
the old one goes on serving; only then does the alias switch, under the same lock admission takes, so a request
is admitted by exactly one version and finishes on it. A version no alias uses any more takes no new requests,
and is closed once the requests it admitted are done. A version that fails to load (its file gone or changed
since registration: the SHA-256 is checked) is logged and skipped until the alias moves again; the old one
keeps serving.

- A/B (`ab_share`): a request goes to the challenger when a stable hash of its key (the caller's X-Request-ID,
  else its asset id, else its request id) falls below the share: the same key always meets the same arm.
- Shadow (`shadow_share`): after the champion answered, a sampled copy (the same hash with another salt) runs on
  the challenger; its result goes to `shadow.ShadowStats` only, never to a caller.
Every result and job names the version that answered (`model_version`, `NAME/VERSION`).
"""

from __future__ import annotations

import gc
import hashlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch

from inference.registry import ModelRegistryError, ModelVersion
from inference.registry.checkpoint_check import file_sha256
from inference.service.config import ServiceConfig
from inference.service.metrics import ServiceStats, exposition
from inference.service.pipeline import GenerationRequest, GenerationResult
from inference.service.service import GenerationService, GenerationServiceError
from inference.service.shadow import ShadowStats, agreement

log = logging.getLogger(__name__)

AB_SALT, SHADOW_SALT = "ab", "shadow"


def share_of(key: str, salt: str) -> float:
    """A stable position of `key` in [0, 1): the same in every process and run (unlike `hash`)."""
    digest = hashlib.blake2b(f"{salt}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2 ** 64


def request_key(request: GenerationRequest) -> str:
    return request.client_id or request.asset_id or request.id


def ab_arm(key: str, challenger_share: float) -> str:
    return "challenger" if share_of(key, AB_SALT) < challenger_share else "champion"


@dataclass
class _Admitted:
    """Requests a version admitted and that have not settled (shadow copies included). The futures' callbacks
    hold this, not the version's service, so a retired version's models can be freed while its jobs are kept."""

    count: int = 0


@dataclass
class _Served:
    version: ModelVersion
    service: GenerationService
    admitted: _Admitted = field(default_factory=_Admitted)


class Rollout:
    """What the HTTP app serves: `submit`, `cfg`, `tokens_for`, `stats`, `close`, like one service."""

    def __init__(self, cfg: ServiceConfig, resolve: Callable[[str], Optional[ModelVersion]],
                 build: Callable[[ServiceConfig], GenerationService], ab_share: float = 0.0,
                 shadow_share: float = 0.0, poll_s: float = 5.0):
        """`resolve(alias)`: the version an alias points at now; `build(cfg)`: a warmed-up service."""
        self.base_cfg, self.resolve, self.build = cfg, resolve, build
        self.ab_share, self.shadow_share, self.poll_s = ab_share, shadow_share, poll_s
        self.aliases = ("champion", "challenger") if ab_share or shadow_share else ("champion",)
        self.shadow = ShadowStats()
        self._lock = threading.Condition()
        self._served: dict[int, _Served] = {}
        self._retiring: list[_Served] = []
        self._arms: dict[str, int] = {}
        self._skipped: dict[str, int] = {}    # alias -> a version that failed to load, not retried
        self._compare = ThreadPoolExecutor(1, thread_name_prefix="shadow-compare")
        self.poll()
        if "champion" not in self._arms:
            for served in self._served.values():
                served.service.close()
            raise ModelRegistryError("no champion to serve: the champion alias points at no loadable version; "
                                     "`featurectl models promote NAME VERSION --alias champion`")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow_aliases, name="model-rollout", daemon=True)
        self._thread.start()

    # ---- what the app uses ------------------------------------------------------------------------
    @property
    def champion(self) -> GenerationService:
        with self._lock:
            return self._served[self._arms["champion"]].service

    @property
    def cfg(self) -> ServiceConfig:
        return self.champion.cfg

    def tokens_for(self, request: GenerationRequest) -> int:
        """The shape tokens a mesh for `request` costs: those of the version its arm serves now (a challenger
        may generate more than the champion)."""
        with self._lock:
            return self._served[self._arms[self._arm(request)]].service.tokens_for(request)

    @property
    def stats(self) -> "RolloutStats":
        return RolloutStats(self)

    def versions(self) -> dict[str, str]:
        """Alias -> `NAME/VERSION` now served under it."""
        with self._lock:
            return {alias: self._served[v].version.label for alias, v in self._arms.items()}

    def submit(self, request: GenerationRequest) -> "Future[GenerationResult]":
        """Admit the request on its arm's version; raises what `GenerationService.submit` raises."""
        with self._lock:
            arm = self._arm(request)
            served = self._served[self._arms[arm]]
            request.model_version = served.version.label
            future = served.service.submit(request)
            served.admitted.count += 1
            admitted = served.admitted
        shadowed = arm == "champion" and self.shadow_share and \
            share_of(request_key(request), SHADOW_SALT) < self.shadow_share
        future.add_done_callback(partial(self._settled, admitted, request if shadowed else None))
        return future

    def _arm(self, request: GenerationRequest) -> str:
        """The alias that serves `request` (the caller holds the lock): its A/B arm, the champion when no
        challenger is loaded."""
        arm = ab_arm(request_key(request), self.ab_share) if self.ab_share else "champion"
        return arm if arm in self._arms else "champion"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.poll_s + 60)
        with self._lock:
            services = [s.service for s in [*self._served.values(), *self._retiring]]
        for service in services:
            service.close()
        self._compare.shutdown(wait=True)

    # ---- following the aliases --------------------------------------------------------------------
    def poll(self) -> None:
        """Follow each alias once (the thread does this every `poll_s`); a registry error keeps what is served."""
        for alias in self.aliases:
            try:
                self._follow(alias)
            except Exception as exc:  # registry unreachable, a bad row: serving goes on with the loaded versions
                log.error("cannot follow @%s (%s); serving what is loaded", alias, exc)

    def _follow_aliases(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def _follow(self, alias: str) -> None:
        version = self.resolve(alias)
        current = self._arms.get(alias)
        if version is None:
            if current is not None and alias != "champion":      # the challenger alias was removed
                self._switch(alias, None)
            return
        if version.version == current or self._skipped.get(alias) == version.version:
            return
        served = self._served.get(version.version) or self._load(alias, version)
        if served is not None:
            self._switch(alias, served)

    def _load(self, alias: str, version: ModelVersion) -> Optional[_Served]:
        try:
            if file_sha256(Path(version.source)) != version.sha256:
                raise ModelRegistryError(f"`{version.source}` changed since it was registered (SHA-256 differs); "
                                         "register the new file as a new version")
            started = time.perf_counter()
            service = self.build(replace(self.base_cfg, model=version.config, gpt_weights=version.source))
            log.info("%s loaded and warmed up in %.1fs", version.label, time.perf_counter() - started)
        except Exception as exc:  # missing or changed file, wrong config: keep serving the loaded version
            self._skipped[alias] = version.version
            log.error("cannot load %s for @%s (%s); still serving %s", version.label, alias, exc,
                      self.versions().get(alias, "nothing"))
            return None
        return _Served(version, service)

    def _switch(self, alias: str, served: Optional[_Served]) -> None:
        with self._lock:
            if served is None:
                del self._arms[alias]
            else:
                self._served[served.version.version] = served
                self._arms[alias] = served.version.version
            used = set(self._arms.values())
            retired = [s for v, s in self._served.items() if v not in used]
            for s in retired:
                del self._served[s.version.version]
            self._retiring += retired
        log.info("@%s -> %s", alias, served.version.label if served else "none")
        for s in retired:
            threading.Thread(target=self._retire, args=(s,), name="model-retire", daemon=True).start()

    def _retire(self, served: _Served) -> None:
        """Close a version nobody routes to once the requests it admitted have settled, and free its memory."""
        with self._lock:
            while served.admitted.count:
                self._lock.wait()
        served.service.close()
        with self._lock:
            self._retiring.remove(served)
        log.info("%s retired", served.version.label)
        del served
        _release_memory()

    # ---- settling and shadow copies ---------------------------------------------------------------
    def _settled(self, admitted: _Admitted, shadowed: Optional[GenerationRequest], future: Future) -> None:
        with self._lock:
            admitted.count -= 1
            self._lock.notify_all()
        if shadowed is not None and not future.cancelled() and future.exception() is None:
            self._shadow(shadowed, future.result())

    def _shadow(self, request: GenerationRequest, answered: GenerationResult) -> None:
        copy = GenerationRequest(request.prompt, request.asset_id, request.seed, request.top_p, shadow=True)
        with self._lock:
            version = self._arms.get("challenger")
            if version is None or self._served[version].version.label == answered.model_version:
                return
            served = self._served[version]
            copy.model_version = label = served.version.label
            try:
                future = served.service.submit(copy)
            except GenerationServiceError:  # its queue is full: the shadow is skipped, never waited for
                self.shadow.count(label, "dropped")
                return
            served.admitted.count += 1
            admitted = served.admitted
        future.add_done_callback(partial(self._shadow_done, admitted, label, answered))

    def _shadow_done(self, admitted: _Admitted, label: str, answered: GenerationResult, future: Future) -> None:
        self._settled(admitted, None, future)
        if future.cancelled() or future.exception() is not None:
            self.shadow.count(label, "failed")
            return
        try:
            self._compare.submit(self._compare_results, label, answered, future.result())
        except RuntimeError:  # the rollout is closing: the comparison is not needed any more
            log.debug("shadow comparison of %s skipped: shutting down", label)

    def _compare_results(self, label: str, answered: GenerationResult, shadow: GenerationResult) -> None:
        try:
            measured = agreement(answered.tokens, answered.glb, shadow.tokens, shadow.glb)
        except Exception as exc:  # a mesh trimesh cannot read: counted, never raised into a server thread
            log.warning("shadow comparison of %s failed: %s", label, exc)
            self.shadow.count(label, "failed")
            return
        self.shadow.compared(label, shadow.stages["total"], measured)


def _release_memory() -> None:
    """Free a retired version's models now: they sit in reference cycles, and a server freezes what exists after
    each start-up out of the collector's reach (`gc.freeze`), so thaw, collect, freeze again."""
    frozen = gc.get_freeze_count()
    if frozen:
        gc.unfreeze()
    gc.collect()
    if frozen:
        gc.freeze()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()                  # the freed blocks back to the driver, for the next version


class RolloutStats:
    """`/metrics` and `/stats` of a rollout: one series per served version, labelled arm and version, plus shadow."""

    def __init__(self, rollout: Rollout):
        self.rollout = rollout

    def series(self) -> list[tuple[dict[str, str], ServiceStats]]:
        """(labels, stats) per served version, and its shadow copies' as arm `shadow` once it ran any."""
        r = self.rollout
        with r._lock:
            served = [(s, "+".join(a for a, v in r._arms.items() if v == s.version.version) or "retired")
                      for s in [*r._served.values(), *r._retiring]]
        out = []
        for s, arm in served:
            out.append(({"arm": arm, "version": s.version.label}, s.service.stats))
            if any(s.service.shadow_stats.outcomes.values()):
                out.append(({"arm": "shadow", "version": s.version.label}, s.service.shadow_stats))
        return out

    def exposition(self) -> bytes:
        return exposition(self.series, self.rollout.shadow)

    def summary(self) -> dict:
        series = [{**labels, **stats.summary()} for labels, stats in self.series()]
        return {"series": series, "aliases": self.rollout.versions(), "shadow": self.rollout.shadow.summary()}
