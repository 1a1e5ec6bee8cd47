"""A secure nats-server with one user's monitoring key applied, for the live-watch tests."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from nats.js import JetStreamContext

from lodestream.client.credential import MonitorCredential
from lodestream.infra.nats.auth import render_authorization
from lodestream.infra.nats.monitor import MonitorKey
from lodestream.schemas.codec import encode
from lodestream.schemas.envelope import Event
from tests.fixtures.nats import SecureNats
from tests.support.builders import job_created, lifecycle


def apply_monitors(secure: SecureNats, monitors: Sequence[MonitorKey]) -> None:
    """Reload the server with its sites and ``monitors`` (what the credential sync renders)."""
    authz = render_authorization(secure.user, secure.password, secure.public_keys, monitors)
    secure.server.reload(dataclasses.replace(secure.server.config, authorization=authz))


def monitor_for(secure: SecureNats, sites: Sequence[str], user: str = "ada") -> MonitorCredential:
    """A fresh credential of ``user`` for ``sites``, applied to the server."""
    credential = MonitorCredential.new(secure.server.websocket_url, secure.ca_file)
    apply_monitors(secure, [MonitorKey(user, credential.public_key, tuple(sites))])
    return credential


async def append_jobs(js: JetStreamContext, site: str, jobs: int) -> list[int]:
    """Append ``jobs`` whole job lifecycles at ``site`` (five events each); their sequences."""
    seqs = []
    for _ in range(jobs):
        created = job_created(site, "ada")
        events: list[Event] = [created, *lifecycle(created)]
        for event in events:
            ack = await js.publish(event.subject, encode(event))
            seqs.append(ack.seq)
    return seqs
