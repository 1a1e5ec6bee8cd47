"""A JetStream node partitioned from the cluster and healed, then Postgres restarted, under
load (issue 16).

While jobs are submitted and run, the node leading EVENTS is taken off the cluster's
network (it keeps running, cut from the other nodes and from the host) and put back five
seconds later; then the Postgres container is restarted. Every job must end final, none
lost, none run twice unless a lease expiry on the log says why, the read model must equal
a rebuild, and every node must hold the same copy of EVENTS. Printed: how long appends
stalled at the partition, how long the healed node took to hold the stream again, how
long Postgres was away.

``LODE_CLUSTER_JOBS`` sets the run's size (200 here; ``make cluster-test`` runs 2,000).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from lodestream.schemas.subjects import EVENTS_STREAM
from tests.chaos.verify import summary
from tests.chaos.workload import submit_waves, workload
from tests.containers.hostside import (
    FAULT_TEST_MARKS,
    OWNER,
    SITE,
    controller_retries,
    judge,
    keep_evidence,
    running,
    until_final,
)
from tests.containers.replicas import replicas_agree
from tests.containers.stall import StallProbe
from tests.fixtures.containers import ContainerCluster, PostgresContainer
from tests.support.chaos import ChaosPlan

pytestmark = FAULT_TEST_MARKS
JOBS = int(os.environ.get("LODE_CLUSTER_JOBS", "200"))
PLAN = ChaosPlan(jobs=JOBS, run_s=(0.05, 0.1, 0.2), pilots=1)
WAVES = 20
WAVE_SPACING_S = 0.5
PARTITION_AFTER_S = 2.0  # into the submission
PARTITION_S = 5.0  # longer than an election
# The default TTL (the tests' 3 s would be shorter than the partition): a pilot whose node is
# cut off notices the dead link after two unanswered pings (every TTL / 4) and reconnects
# to another node within its TTL, so it keeps its session and its leases.
HEARTBEAT_TTL_S = 10
PG_RESTART_AFTER_HEAL_S = 2.0


@pytest.mark.timeout(600)
async def test_a_partitioned_node_and_a_restarted_postgres_lose_no_job(
    nats_cluster: ContainerCluster, postgres_container: PostgresContainer, tmp_path: Path
) -> None:
    waves = workload(PLAN, SITE, OWNER, waves=WAVES)
    ids = [job.aggregate_id for wave in waves for job in wave.jobs]
    engine, network = nats_cluster.engine, nats_cluster.network
    stop_probe = asyncio.Event()
    async with running(
        nats_cluster, postgres_container, tmp_path, heartbeat_ttl_s=HEARTBEAT_TTL_S
    ) as run:
        js = run.js
        probe = StallProbe(js, SITE)
        probing = asyncio.create_task(probe.run(stop_probe))
        try:
            submitter = asyncio.create_task(submit_waves(js, waves, WAVE_SPACING_S, timeout_s=300))
            await asyncio.sleep(PARTITION_AFTER_S)
            info = await js.stream_info(EVENTS_STREAM)
            assert info.cluster is not None
            leader = info.cluster.leader
            assert leader is not None
            node = nats_cluster.nodes[leader]
            cut_at = time.monotonic()
            await asyncio.to_thread(node.partition, engine, network)
            await asyncio.sleep(PARTITION_S)
            await asyncio.to_thread(node.heal, engine, network)
            stalled_s = probe.longest_gap_after(cut_at)
            await asyncio.sleep(PG_RESTART_AFTER_HEAL_S)
            pg_at = time.monotonic()
            await asyncio.to_thread(postgres_container.restart, engine)
            pg_away_s = time.monotonic() - pg_at
            submitted = await submitter
            states = await until_final(run.dsn, ids, timeout_s=max(180, JOBS / 5))
        finally:
            stop_probe.set()
            await probing
        log, problems = await judge(run, ids, waves)
        agree, copies, caught_up_s = await replicas_agree(nats_cluster, EVENTS_STREAM, timeout_s=60)
        if not agree:
            problems.append(f"the nodes' copies of {EVENTS_STREAM} differ: {copies}")
        if problems:
            keep_evidence(log, ids, states, run.logs)
        print(summary(log, ids, waves, run.site.data_dir, rounds=1))
        print(controller_retries(run.host))
        print(
            f"{JOBS} jobs, states {dict(states)}; partitioned {node.name} (the EVENTS leader) "
            f"for {PARTITION_S:g} s: appends stalled {stalled_s:.2f} s; every node held the "
            f"same EVENTS {caught_up_s:.2f} s after the run ({copies}); Postgres restarted "
            f"in {pg_away_s:.2f} s; the submitter retried {submitted.retries} appends"
        )
    assert not problems, "\n".join(problems)
