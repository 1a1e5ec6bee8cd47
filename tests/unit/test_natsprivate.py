"""The nats-py internals lodestream relies on are there, in the shape it uses them.

An upgrade of nats-py that renames, removes or reshapes one fails here, naming it, rather
than deep in a consumer at run time. The names are listed in :mod:`lodestream.natsprivate`.
"""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest
from nats.aio.client import Client
from nats.aio.subscription import Subscription
from nats.aio.transport import WebSocketTransport
from nats.js import JetStreamContext

from lodestream import natsprivate

NATS_PY = version("nats-py")
METHODS = {**natsprivate.CALLED, **natsprivate.OVERRIDDEN}


@pytest.mark.parametrize(("owner", "name"), list(METHODS), ids=lambda x: getattr(x, "__name__", x))
def test_each_method_keeps_its_parameters(owner: type, name: str) -> None:
    method = getattr(owner, name, None)
    assert callable(method), f"nats-py {NATS_PY}: {owner.__qualname__}.{name} is gone"
    params = tuple(inspect.signature(method).parameters)
    assert params == METHODS[owner, name], (
        f"nats-py {NATS_PY}: {owner.__qualname__}.{name}{params} is not the shape "
        f"lodestream/natsprivate.py and its users expect: {METHODS[owner, name]}"
    )


async def instances() -> dict[type, object]:
    nc = Client()
    transport = WebSocketTransport()  # opens an aiohttp session: needs a running loop
    await transport._client.close()
    return {
        Client: nc,
        JetStreamContext: JetStreamContext(nc),
        WebSocketTransport: transport,
        Subscription: Subscription(nc, id=7, subject="inbox"),
    }


async def test_each_attribute_is_there_on_a_fresh_instance() -> None:
    made = await instances()
    missing = [
        f"{owner.__qualname__}.{name}"
        for owner, names in natsprivate.INHERITED.items()
        for name in names
        if not hasattr(made[owner], name)
    ]
    assert not missing, f"nats-py {NATS_PY} no longer has {', '.join(missing)}"


async def test_the_accessors_read_what_they_name() -> None:
    made = await instances()
    nc, js, sub = made[Client], made[JetStreamContext], made[Subscription]
    assert isinstance(nc, Client)
    assert isinstance(js, JetStreamContext)
    assert isinstance(sub, Subscription)
    assert natsprivate.connection_of(js) is nc
    assert natsprivate.api_prefix(js) == "$JS.API"
    assert natsprivate.api_prefix(JetStreamContext(nc, domain="alpha")) == "$JS.alpha.API"
    assert natsprivate.transport_of(nc) is None  # until the first connect
    assert natsprivate.subscription_id(sub) == 7
    assert natsprivate.subscription(nc, 7) is None  # never subscribed on the connection
    assert natsprivate.pending_queue(sub).empty()
    assert bytes(natsprivate.inbox_prefix(nc)) == b"_INBOX"
    assert not natsprivate.would_overflow(nc, 0)  # connected or not, nothing is over nothing


async def test_a_replaced_delivery_is_the_connections_until_restored() -> None:
    nc = Client()
    own = natsprivate.delivery_of(nc)
    seen: list[int] = []

    async def mine(sid: int, *_: object) -> None:
        seen.append(sid)

    natsprivate.replace_delivery(nc, mine)
    await natsprivate.delivery_of(nc)(3, b"s", b"", b"", None)
    assert seen == [3]
    natsprivate.restore_delivery(nc)
    assert natsprivate.delivery_of(nc) == own
