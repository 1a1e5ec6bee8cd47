"""Which key bindings may go into nats-server's authorization: a pure plan, no I/O.

nats-server refuses a whole configuration for one bad entry (a key that does not decode, the
same nkey twice), and a refused configuration changes nothing for anyone. So before
rendering, every binding is checked on its own and the keys are deduplicated: a key held by
two principals goes to the one ``public.bound_keys`` says holds it (the API binds keys
there, one principal per key), and if none of them does, to none. Whatever is left out is
a reject, with the reason its owner is shown.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from lodestream.schemas.nkey import check_user_public_key

Kind = Literal["site", "monitor"]
Holder = tuple[Kind, str]

_WHAT: Final = {"site": "a site", "monitor": "a monitoring credential"}


@dataclass(frozen=True, slots=True, order=True)
class Binding:
    """One principal's key as nats-server would get it: a live site, or a user's monitoring
    key with the user's live sites (a change of those is a change of the binding)."""

    kind: Kind
    holder: str  # the site's name, or the user's
    public_key: str
    sites: tuple[str, ...] = ()

    @property
    def principal(self) -> Holder:
        return (self.kind, self.holder)


@dataclass(frozen=True, slots=True)
class Plan:
    usable: tuple[Binding, ...]
    rejects: dict[Binding, str]  # left out, and why (shown to the binding's owner)


def plan(
    bindings: Iterable[Binding],
    claims: Mapping[str, Holder],
    reserved: Collection[str],
    check: Callable[[Binding], None],
) -> Plan:
    """Split ``bindings`` into those nats-server can take together and those it cannot.

    ``claims``: the principal each key is bound to (``public.bound_keys``); ``reserved``:
    the control plane's own keys; ``check``: raises ValueError if the binding's entry alone
    does not render.
    """
    rejects: dict[Binding, str] = {}
    by_key: dict[str, list[Binding]] = defaultdict(list)
    for binding in sorted(bindings):
        try:
            check_user_public_key(binding.public_key)  # what nats-server checks: checksum too
            check(binding)
        except ValueError as exc:
            rejects[binding] = str(exc)
            continue
        if binding.public_key in reserved:
            rejects[binding] = "its key is the control plane's own"
            continue
        by_key[binding.public_key].append(binding)
    usable: list[Binding] = []
    for key, holders in by_key.items():
        if len(holders) == 1:
            usable.append(holders[0])
            continue
        owner = claims.get(key)
        for binding in holders:
            if binding.principal == owner:
                usable.append(binding)
                continue
            others = sorted({_WHAT[b.kind] for b in holders if b is not binding})
            rejects[binding] = f"its key is also bound to {' and '.join(others)}"
    return Plan(tuple(sorted(usable)), rejects)
