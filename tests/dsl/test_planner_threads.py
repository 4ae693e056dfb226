"""Planning on a Java thread other than the one that created the TableEnvironment: py4j's pooled connections make
that happen in a long process (a CI run failed with it); `common.flink.pin_planner` makes it plan."""

from __future__ import annotations

import pytest
from py4j.protocol import Py4JJavaError

from common.flink import pin_planner

QUERY = "SELECT a, COUNT(*) FROM planner_threads WHERE b > 3 AND a IS NOT NULL GROUP BY a"


@pytest.mark.integration
def test_a_query_plans_on_a_java_thread_the_environment_was_not_created_on(flink_env):
    from pyflink.java_gateway import get_gateway

    flink_env.execute_sql("CREATE TEMPORARY TABLE IF NOT EXISTS planner_threads (a STRING, b BIGINT) "
                          "WITH ('connector' = 'datagen')")
    flink_env.explain_sql(QUERY)
    client = get_gateway()._gateway_client
    held = client._get_connection()  # this thread's usual connection is busy: the next calls get a new Java thread
    try:
        cluster = flink_env._j_tenv.getPlanner().plannerContext().getCluster()
        cluster.invalidateMetadataQuery()  # what the planner's rules do between steps
        with pytest.raises(Py4JJavaError, match="metadataHandlerProvider"):
            flink_env.explain_sql(QUERY)
        pin_planner(flink_env)
        assert "GroupAggregate" in flink_env.explain_sql(QUERY)
    finally:
        client._give_back_connection(held)
