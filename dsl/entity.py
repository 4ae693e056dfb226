"""Entities: what features describe (an asset, a user), identified by one or more typed join keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from dsl.errors import DefinitionError, backticked
from dsl.names import check_name
from dsl.types import ValueType

_KEY_TYPES = (ValueType.STRING, ValueType.INT32, ValueType.INT64)


@dataclass(frozen=True)
class Entity:
    name: str
    join_keys: Mapping[str, ValueType]
    description: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        where = f"entity {backticked(self.name)}"
        check_name(where, "name", self.name)
        if not self.join_keys:
            raise DefinitionError(where, "has no join keys", "pass join_keys={\"asset_id\": String}")
        for key, kind in self.join_keys.items():
            check_name(where, "join key", key)
            if not isinstance(kind, ValueType) or kind not in _KEY_TYPES:
                raise DefinitionError(where, f"join key `{key}` has type {getattr(kind, 'value', kind)!r}",
                                      "join keys must be String, Int32 or Int64")
        object.__setattr__(self, "join_keys", dict(self.join_keys))
