"""The naming rules of definitions, checked eagerly so that nothing downstream has to second-guess a name.

- Entities, join keys, sources, feature views, features and feature services: `NAME_RULE`. Their names become
  Feast names, Redis keys (`view:feature`, hence no `:`), Kafka topic and Flink table names, Parquet and pandas
  columns, so one strict rule serves them all.
- Source columns follow the data: any printable name Flink can carry (`dsl.sql.identifier_problem`), quoted
  wherever SQL uses it; the `__` prefix and the compiler's own column names are reserved (`dsl.source`).
- Kafka topics: Kafka's own rule, leaving room for the `.dead-letters` suffix of the source's dead-letter topic.
"""

from __future__ import annotations

import re

from dsl.errors import DefinitionError, backticked

MAX_NAME = 64
NAME_RULE = f"ASCII letters, digits and _, starting with a letter, at most {MAX_NAME} characters"
_NAME = re.compile(rf"[A-Za-z][A-Za-z0-9_]{{0,{MAX_NAME - 1}}}")

MAX_TOPIC = 249 - len(".dead-letters")
_TOPIC = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_TOPIC}}}")


def check_name(where: str, what: str, name: object, other_fix: str = "") -> None:
    """Refuse `name` (the `what` of the object `where`, e.g. "name" or "feature name") unless it follows
    NAME_RULE; `other_fix` ends the hint, e.g. ", or ..."."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise DefinitionError(where, f"{what} {backticked(name)} is not allowed",
                              f"use {NAME_RULE} (names become Feast names and Redis keys){other_fix}")


def check_topic(where: str, topic: object) -> None:
    """Refuse a Kafka topic name Kafka would refuse, or whose dead-letter topic it would."""
    if not isinstance(topic, str) or not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise DefinitionError(where, f"kafka_topic {backticked(topic)} is not a Kafka topic name",
                              f"use ASCII letters, digits, `.`, `_` and `-`, at most {MAX_TOPIC} characters "
                              "(Kafka's 249 less the `.dead-letters` of the source's dead-letter topic)")
