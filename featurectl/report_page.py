"""The project report: one self-contained HTML page of plots (PNG, drawn by matplotlib without a browser, inlined
as data URIs), from what `featurectl report` gathered (`ReportData`): the registry's views and quality records, the
freshness record and its history in Redis, and optionally a feature server's `/stats`.

Sections, each a heading, a sentence on where its data comes from, and one figure per plot:
freshness (age of each view's newest value over time), null rates (per backfill and feature), distributions
(offline profile against the values served), drift (PSI per feature), serving (latency percentiles and rows
served per view). A section without data says why instead of drawing an empty plot.

It lives beside the command because the page reads every part (the registry's records, Redis's, a server's
`/stats`) and no part reads it: the CLI is the one layer above them all.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from matplotlib.figure import Figure

from common.feature_profile import NUMERIC, FeatureProfile
from common.quality_log import QualityRecord
from redis_store.freshness_history import GAP_MS, FreshnessSample

DPI = 100
MIN_AGE_S = 1.0  # the age axis is logarithmic: ages below a second (or ahead of the clock) are drawn at 1 s
# a line straight on the log axis between two ages understates the linear growth between them; points no more
# than this ratio apart keep the understatement under 1 %
AGE_STEP = 1.25
PSI_BANDS = ((0.1, "moderate"), (0.25, "large"))
TOP_BACKFILLS = 10


@dataclass(frozen=True)
class ViewData:
    """One registered view: its ttl, its backfills' quality records (oldest first)."""

    name: str
    ttl_s: Optional[float]
    backfills: list[QualityRecord] = field(default_factory=list)


@dataclass(frozen=True)
class ReportData:
    project: str
    now: dt.datetime
    views: list[ViewData]
    history: list[FreshnessSample]  # oldest first
    newest_ms: dict[str, int]  # the freshness record now
    server: Optional[str] = None  # the feature server asked, if any
    stats: Optional[dict[str, Any]] = None  # its /stats, None: not asked or not readable
    notes: list[str] = field(default_factory=list)  # what could not be read, and why
    redis_read: bool = True  # False: Redis did not answer (`history` and `newest_ms` are empty for that)


@dataclass(frozen=True)
class Plot:
    id: str
    caption: str
    png: bytes


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    source: str
    plots: list[Plot] = field(default_factory=list)
    empty: Optional[str] = None  # why there is no plot


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


def _time(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


def age_line(samples: Sequence[tuple[int, int]], now_ms: int) -> tuple[list[dt.datetime], list[float]]:
    """The age of a view's newest value (s) from (sampled at ms, newest event time ms) pairs, oldest first: it
    drops at each sample and grows with the clock until the next one, then to `now_ms`. Between two samples the
    age grows linearly, a curve on the log axis: it is drawn through points at most `AGE_STEP` apart."""
    times, ages = [], []
    for i, (at_ms, newest) in enumerate(samples):
        until = samples[i + 1][0] if i + 1 < len(samples) else now_ms
        first, last = max((at_ms - newest) / 1000, MIN_AGE_S), max((until - newest) / 1000, MIN_AGE_S)
        steps = 1
        while last > first * AGE_STEP ** steps:
            steps += 1
        for k in range(steps + 1):
            age = first * (last / first) ** (k / steps)
            times.append(_time(at_ms if k == 0 else until if k == steps else newest + round(age * 1000)))
            ages.append(age)
    return times, ages


def _view_samples(data: ReportData, view: str) -> list[tuple[int, int]]:
    """The view's samples, ended by the record now when it is newer than the last one (each raise updates the
    history's last entry, so only a history written before that rule, or cut short, leaves one out: it came within
    `GAP_MS` of the last sample, so it is placed there); with no sample at all (a record older than its history), at
    now."""
    samples = [(s.at_ms, s.newest_ms[view]) for s in data.history if view in s.newest_ms]
    now_ms = int(data.now.timestamp() * 1000)
    newest = data.newest_ms.get(view)
    if newest is not None and (not samples or newest > samples[-1][1]):
        written = samples[-1][0] + GAP_MS if samples else now_ms
        samples.append((min(now_ms, written), newest))
    return samples


def freshness_section(data: ReportData) -> Section:
    source = ("Age of each view's newest value in Redis over time: the freshness record's history in Redis (a "
              "sample each time a writer raised a view's newest event time, one per 5 s window), up to now. "
              "Dashed: the view's ttl.")
    now_ms = int(data.now.timestamp() * 1000)
    lines = {v.name: _view_samples(data, v.name) for v in data.views}
    lines = {name: samples for name, samples in lines.items() if samples}
    if not lines:
        why = ("no view has a recorded newest event time: nothing was materialized, streamed or pushed to these "
               "views by featurectl yet") if data.redis_read else "Redis could not be read (see the note above)"
        return Section("freshness", "Freshness over time", source, empty=why)
    figure = Figure(figsize=(10, 4))
    ax = figure.subplots()
    for index, (name, samples) in enumerate(sorted(lines.items())):
        color = f"C{index % 10}"
        ax.plot(*age_line(samples, now_ms), label=name, color=color, linewidth=1.5,
                marker="o" if len(samples) == 1 else None)  # one sample taken now: a point
        ttl = next(v.ttl_s for v in data.views if v.name == name)
        if ttl:
            ax.axhline(ttl, color=color, linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("age of the newest value (s)")
    ax.set_xlabel("time (UTC)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize="small")
    figure.autofmt_xdate()
    return Section("freshness", "Freshness over time", source,
                   [Plot("freshness-age", "Age of each view's newest value", _png(figure))])


def _backfill_label(record: QualityRecord) -> str:
    return f"{record.start:%m-%d %H:%M}..{record.end:%m-%d %H:%M}"


def null_rate_section(data: ReportData) -> Section:
    source = ("Share of rows without a value (null or NaN) per feature, in each of the view's last backfills: the "
              "quality log in the registry database, written by `featurectl backfill`.")
    plots = []
    for view in data.views:
        records = [r for r in view.backfills if r.null_rates][-TOP_BACKFILLS:]
        if not records:
            continue
        features = sorted({f for r in records for f in r.null_rates})
        figure = Figure(figsize=(10, min(12.0, 1.5 + 0.25 * len(features) * len(records))))
        ax = figure.subplots()
        height = 0.8 / len(records)
        for index, record in enumerate(records):
            offsets = [i + index * height for i in range(len(features))]
            ax.barh(offsets, [100 * record.null_rates.get(f, 0.0) for f in features], height=height,
                    label=_backfill_label(record))
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(features))], features)
        ax.invert_yaxis()
        ax.set_xlabel("rows without a value (%)")
        ax.set_xlim(0, 100)
        ax.legend(title="backfill (UTC)", fontsize="small", loc="lower right")
        ax.set_title(view.name)
        plots.append(Plot(f"nulls-{view.name}", f"Null rates of `{view.name}`", _png(figure)))
    return Section("null-rates", "Null rates", source, plots,
                   None if plots else "no backfill was checked yet (`featurectl backfill` records them)")


def bin_labels(profile: FeatureProfile) -> list[str]:
    if profile.kind == NUMERIC:
        cuts = [f"{c:.4g}" for c in profile.cuts]
        if not cuts:
            return ["all"]
        return [f"<= {cuts[0]}"] + [f"({a}, {b}]" for a, b in zip(cuts, cuts[1:])] + [f"> {cuts[-1]}"]
    return [str(c) for c in profile.categories] + ["other"]


def _served(data: ReportData) -> dict[str, dict[str, dict[str, Any]]]:
    return (data.stats or {}).get("drift", {})


def distribution_section(data: ReportData) -> Section:
    source = ("Offline: each feature's profile of its view's latest backfill (share of the rows' time in each bin, "
              "the quality log in the registry). Online: the values a feature server served lately in the same "
              "bins (its drift sample, `/stats`), when `--server` is given.")
    served = _served(data)
    plots = []
    for view in data.views:
        latest = view.backfills[-1].profiles if view.backfills else {}
        features = sorted(set(latest) | set(served.get(view.name, {})))
        if not features:
            continue
        columns = min(3, len(features))
        rows = -(-len(features) // columns)
        figure = Figure(figsize=(4 * columns, 3 * rows), layout="constrained")
        axes = figure.subplots(rows, columns, squeeze=False).ravel()
        for ax, feature in zip(axes, features):
            online = served.get(view.name, {}).get(feature)
            profile = FeatureProfile.from_json(online["profile"]) if online else latest[feature]
            labels = bin_labels(profile)
            positions = range(len(labels))
            ax.bar([p - 0.2 for p in positions], [100 * s for s in profile.shares], width=0.4, label="offline")
            if online and sum(online["counts"]):
                total = sum(online["counts"])
                ax.bar([p + 0.2 for p in positions], [100 * c / total for c in online["counts"]], width=0.4,
                       label=f"served ({total:,})")
            ax.set_xticks(list(positions), labels, rotation=45, ha="right", fontsize="x-small")
            ax.set_ylabel("%")
            ax.set_title(feature, fontsize="small")
            ax.legend(fontsize="x-small")
        for ax in axes[len(features):]:
            ax.set_visible(False)
        figure.suptitle(view.name)
        plots.append(Plot(f"distribution-{view.name}", f"Distributions of `{view.name}`", _png(figure)))
    return Section("distributions", "Distributions offline and online", source, plots,
                   None if plots else "no feature profile yet: run `featurectl backfill`")


def drift_section(data: ReportData) -> Section:
    source = ("Population stability index of the values a feature server served lately against the latest "
              "backfill's profile (`/stats` `drift`, the figure `/metrics` exports as `featurectl_feature_drift`). "
              "Lines at 0.1 and 0.25: moderate and large drift.")
    scores = sorted((f"{view}:{feature}", entry["psi"]) for view, features in _served(data).items()
                    for feature, entry in features.items() if entry.get("psi") is not None)
    if not scores:
        why = ("the server has sampled no served value of a profiled feature yet" if data.stats is not None
               else _no_server(data))
        return Section("drift", "Drift", source, empty=why)
    figure = Figure(figsize=(10, 1 + 0.35 * len(scores)))
    ax = figure.subplots()
    ax.barh([name for name, _ in scores], [psi for _, psi in scores], color="C1")
    for bound, label in PSI_BANDS:
        ax.axvline(bound, linestyle="--", color="grey", linewidth=0.8)
        ax.text(bound, -0.6, f" {label}", fontsize="x-small", color="grey")
    ax.invert_yaxis()
    ax.set_xlabel("PSI")
    return Section("drift", "Drift", source, [Plot("drift-psi", "PSI per feature", _png(figure))])


def _no_server(data: ReportData) -> str:
    if data.server is None:
        return "no feature server asked: run `featurectl report --server URL` against a running `featurectl serve`"
    return f"the feature server at {data.server} could not be read"


def _service(name: str) -> str:
    return "(features listed)" if name == "-" else name  # the server's name for requests without a service


def serving_section(data: ReportData) -> Section:
    source = ("From the feature server's `/stats` (all workers, since it started): latency percentiles per endpoint "
              "and feature service, and the entity rows it served per view by outcome.")
    if data.stats is None:
        return Section("serving", "Serving", source, empty=_no_server(data))
    plots = []
    latencies = {**{f"endpoint {k}": v for k, v in data.stats.get("endpoints", {}).items()},
                 **{f"service {_service(k)}": v for k, v in data.stats.get("feature_services", {}).items()}}
    latencies = {name: v for name, v in latencies.items() if v.get("count")}
    if latencies:
        points = ["p50", "p90", "p99", "p99.9"]
        figure = Figure(figsize=(10, 1 + 0.5 * len(latencies)))
        ax = figure.subplots()
        height = 0.8 / len(points)
        for index, point in enumerate(points):
            ax.barh([i + index * height for i in range(len(latencies))],
                    [max(v.get(point, 0.0), 0.001) for v in latencies.values()], height=height, label=point)
        ax.set_yticks([i + 0.4 - height / 2 for i in range(len(latencies))],
                      [f"{name} ({v['count']:,})" for name, v in latencies.items()])
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms)")
        ax.legend(fontsize="small")
        plots.append(Plot("serving-latency", "Latency percentiles (requests in brackets)", _png(figure)))
    served = {view: v for view, v in data.stats.get("served_rows", {}).items() if v.get("rows")}
    if served:
        figure = Figure(figsize=(10, 1 + 0.4 * len(served)))
        ax = figure.subplots()
        names = list(served)
        present = [v["rows"] - v["not_found"] - v["outside_max_age"] for v in served.values()]
        missing = [v["not_found"] for v in served.values()]
        stale = [v["outside_max_age"] for v in served.values()]
        ax.barh(names, present, label="present", color="C2")
        ax.barh(names, missing, left=present, label="not found", color="C3")
        ax.barh(names, stale, left=[a + b for a, b in zip(present, missing)], label="past the ttl", color="C1")
        ax.invert_yaxis()
        ax.set_xlabel("entity rows served")
        ax.legend(fontsize="small")
        plots.append(Plot("serving-rows", "Rows served per view", _png(figure)))
    return Section("serving", "Serving", source, plots, None if plots else "the server has answered no request yet")


def sections(data: ReportData) -> list[Section]:
    return [freshness_section(data), null_rate_section(data), distribution_section(data), drift_section(data),
            serving_section(data)]


STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; }
p.source { color: #555; } p.empty { color: #a60; font-style: italic; }
figure { margin: 1em 0; } figure img { max-width: 100%; } figcaption { color: #555; font-size: 0.9em; }
ul.notes { color: #a60; }
"""


def render(data: ReportData) -> str:
    """The page: a heading, what could not be read, then each section with its plots inlined."""
    escape = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>featurectl report: {escape(data.project)}</title><style>{STYLE}</style></head><body>",
           f"<h1>featurectl report: project <code>{escape(data.project)}</code></h1>",
           f"<p>Written {data.now:%Y-%m-%d %H:%M:%S} UTC; views: "
           f"{', '.join(escape(v.name) for v in data.views) or 'none'}; feature server: "
           f"{escape(data.server) if data.server else 'not asked'}.</p>"]
    if data.notes:
        out.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in data.notes) + "</ul>")
    for section in sections(data):
        out.append(f'<section id="{section.id}"><h2>{escape(section.title)}</h2>')
        out.append(f'<p class="source">{escape(section.source)}</p>')
        if section.empty:
            out.append(f'<p class="empty">{escape(section.empty)}</p>')
        for plot in section.plots:
            uri = "data:image/png;base64," + base64.b64encode(plot.png).decode()
            out.append(f'<figure class="plot" id="{escape(plot.id)}"><img alt="{escape(plot.caption)}" '
                       f'src="{uri}"><figcaption>{escape(plot.caption)}</figcaption></figure>')
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out)
