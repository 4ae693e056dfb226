"""`featurectl teardown` removes the tile topics of every generation of a project's streams (a `stream --reset`
names new ones), and no other project's: `streaming.topics.delete_topics(..., project=)` against the real Kafka."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from streaming.topics import delete_topics

pytestmark = pytest.mark.integration


def test_every_generations_tile_topics_go_and_other_projects_stay(local_services):
    bootstrap = local_services.platform.kafka.bootstrap_servers
    project = f"cleanup{uuid.uuid4().hex[:8]}"
    ours = [f"featurectl.{project}.clicks.tiles-{f}" for f in ("0a1b2c3d4e5f", "ffee00112233")]
    theirs = [f"featurectl.{project}x.clicks.tiles-0a1b2c3d4e5f", f"{project}.events"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in ours + theirs]).values():
        future.result()
    try:
        assert delete_topics(bootstrap, [], timeout_s=10, project=project) == sorted(ours)
        deadline = time.monotonic() + 30
        while set(ours) & set(admin.list_topics(timeout=10).topics) and time.monotonic() < deadline:
            time.sleep(0.2)
        listed = admin.list_topics(timeout=10).topics
        assert not set(ours) & set(listed) and set(theirs) <= set(listed)
    finally:
        left = [t for t in ours + theirs if t in admin.list_topics(timeout=10).topics]
        if left:
            for future in admin.delete_topics(left).values():
                future.result()
