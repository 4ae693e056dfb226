"""The body of `POST /push`: Feast's push request, `{"push_source_name": NAME, "df": {column: [values...]}, "to":
"online" | "offline" | "online_and_offline", "allow_registry_cache": true}`, checked by hand so that every bad
body gets a 400 naming the field.

`allow_registry_cache` and `transform_on_write` are Feast's and taken for its clients' sake: the server always uses
the registry it holds (refreshed in the background) and has no transformations to run.
"""

from __future__ import annotations

from typing import Any, Literal

from common.errors import shown
from serving.errors import RequestError
from serving.json_body import load_object

PushMode = Literal["online", "offline", "online_and_offline"]
MODES: tuple[str, ...] = ("online", "offline", "online_and_offline")
FIELDS = ("push_source_name", "df", "to", "allow_registry_cache", "transform_on_write")


class MalformedPushBody(RequestError):
    code = "malformed_json"


def check_source_and_mode(name: Any, to: Any) -> None:
    """A push names its source and one of the modes; the SDK's arguments are checked the same way."""
    if not isinstance(name, str) or not name:
        raise RequestError("the push source (`push_source_name`) must be a non-empty string: an event source's "
                           "name or `{view}_push` of an attribute view")
    if to not in MODES:
        raise RequestError(f"`to` must be one of {', '.join(MODES)}; got {shown(to)}")


def parse_push_request(body: bytes) -> tuple[str, dict[str, list], str]:
    """(push source name, columns, mode) of a push request body."""
    data = load_object(body, FIELDS, "`push_source_name` and `df`", "a push", MalformedPushBody, RequestError)
    name, to = data.get("push_source_name"), data.get("to", "online")
    check_source_and_mode(name, to)
    columns = data.get("df")
    if not isinstance(columns, dict) or not columns or not all(isinstance(v, list) for v in columns.values()):
        raise RequestError('`df` must be an object mapping each column to a list of values, one per row, e.g. '
                           '{"asset_id": ["a1"], "event_time": [1767225600000]}')
    for flag in ("allow_registry_cache", "transform_on_write"):
        if not isinstance(data.get(flag, True), bool):
            raise RequestError(f"`{flag}` must be true or false")
    return name, columns, to
