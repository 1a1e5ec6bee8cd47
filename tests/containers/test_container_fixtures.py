"""The container fixtures themselves: an R3 stream on the cluster, a migrated Postgres."""

from __future__ import annotations

import psycopg
import pytest

from lodestream.eventlog import ensure_streams, jetstream
from lodestream.natsconn import connect
from lodestream.schemas.subjects import EVENTS_STREAM
from tests.fixtures.containers import ContainerCluster, PostgresContainer

# With the fault tests, after the parallel part of `make test`: they share one dockerd.
pytestmark = pytest.mark.alone


async def test_cluster_takes_r3_streams_through_the_operator_settings(
    nats_cluster: ContainerCluster,
) -> None:
    settings = nats_cluster.settings()
    nc = await connect(settings)
    try:
        js = jetstream(nc)
        await ensure_streams(js, settings.stream_replicas)
        info = await js.stream_info(EVENTS_STREAM)
        assert info.config.num_replicas == 3
        assert info.cluster is not None
        replicas = {peer.name for peer in info.cluster.replicas or []} | {info.cluster.leader}
        assert replicas == set(nats_cluster.nodes)
        # The nodes advertise no address of theirs: the client knows only the URLs it was given.
        assert nc.discovered_servers == []
    finally:
        await nc.close()


def test_postgres_container_is_migrated_and_needs_a_password(
    postgres_container: PostgresContainer,
) -> None:
    with psycopg.connect(postgres_container.url) as conn:
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'rm'").fetchone()
    assert tables is not None
    assert tables[0] > 0
    password = postgres_container.url.split(":")[2].split("@")[0]
    wrong = postgres_container.url.replace(f":{password}@", ":wrong@")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=5).close()
