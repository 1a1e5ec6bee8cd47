"""Bytes a site can put on the wire that no event model was ever asked to read.

nats-server checks a subject against the site's permissions token by token, and ``*``
matches any token, bytes that are not UTF-8 included; it stores such a message as it came.
Every consumer of the stream then receives it, so it must not stop any of them.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.security.attack import (
    Api,
    Violations,
    api_client,
    settle,
    site_connection,
)
from tests.support.stack import SITE_OWNERS, Stack

pytestmark = pytest.mark.slow

STALL_S = 20.0  # the pipeline takes well under a second when it works


async def pipeline_works_or_stalls(stack: Stack, api: Api) -> None:
    """:func:`pipeline_works`, failing as soon as a service logs the read loop's death."""
    ids = {site: await api.submit(owner, site, wait=False) for site, owner in SITE_OWNERS.items()}
    try:
        async with asyncio.timeout(STALL_S):
            while True:
                for service in ("projector", "controller"):
                    if "UnicodeDecodeError" in stack.log_text(service):
                        raise AssertionError(f"the {service}'s NATS read loop died: it stalls")
                jobs = [await api.job(SITE_OWNERS[site], job_id) for site, job_id in ids.items()]
                if all(job is not None and job["state"] == "PREPROCESSED" for job in jobs):
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"fresh jobs did not get through in {STALL_S} s") from None


@pytest.mark.parametrize(
    "subject",
    [b"evt.beta.job.\xff\xfe.staged_out", b"hb.beta.\xff\xfe"],
    ids=["event-subject", "heartbeat-subject"],
)
async def test_a_subject_that_is_not_utf8_stops_no_consumer(
    fresh_stack: Stack, subject: bytes
) -> None:
    violations = Violations()
    try:
        async with (
            api_client(fresh_stack) as api,
            site_connection(fresh_stack, "beta", violations) as beta,
        ):
            # nats-py only sends str subjects; the attacker writes the protocol line itself.
            transport = beta._transport
            assert transport is not None
            transport.write(b"PUB %s 2\r\n{}\r\n" % subject)
            await transport.drain()  # type: ignore[no-untyped-call]
            await settle(beta)
            assert violations.errors == []  # the server took it: the subject is beta's
            await pipeline_works_or_stalls(fresh_stack, api)
            assert fresh_stack.alive("projector")
            assert fresh_stack.alive("controller")
    finally:
        # A consumer whose read loop died cannot drain its connection to stop cleanly.
        fresh_stack.kill("projector")
        fresh_stack.kill("controller")
