"""Each cluster node's own copy of a stream, from its monitoring endpoint (``/jsz``).

A stream's info comes from its leader; whether the replicas hold the same messages is
what each node reports for itself. Asked at each node's address on the fixture's own
network (a node that was partitioned and healed has no published port any more).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from typing import Any

from tests.fixtures.containers import HTTP_PORT, ContainerCluster

State = tuple[int, int, int] | str


def node_stream_state(address: str, stream: str) -> State:
    """(messages, first sequence, last sequence) of ``stream`` on one node, or why not."""
    conn = http.client.HTTPConnection(address, HTTP_PORT, timeout=2)
    try:
        conn.request("GET", "/jsz?accounts=true&streams=true")
        document: dict[str, Any] = json.loads(conn.getresponse().read())
    except (OSError, ValueError) as exc:
        return f"no answer: {exc!r}"
    finally:
        conn.close()
    for account in document.get("account_details") or []:
        for detail in account.get("stream_detail") or []:
            if detail.get("name") == stream:
                state = detail["state"]
                return int(state["messages"]), int(state["first_seq"]), int(state["last_seq"])
    return f"no replica of {stream}"


async def replicas_agree(
    cluster: ContainerCluster, stream: str, *, timeout_s: float
) -> tuple[bool, dict[str, State], float]:
    """Wait until every node reports the same state of ``stream``; the states last seen and
    how long the wait took."""
    addresses = {
        name: node.address(cluster.engine, cluster.network) for name, node in cluster.nodes.items()
    }
    began = time.monotonic()
    deadline = began + timeout_s
    while True:
        states = {
            name: await asyncio.to_thread(node_stream_state, address, stream)
            for name, address in addresses.items()
        }
        agree = all(isinstance(state, tuple) for state in states.values()) and (
            len(set(states.values())) == 1
        )
        if agree or time.monotonic() > deadline:
            return agree, states, time.monotonic() - began
        await asyncio.sleep(0.2)
