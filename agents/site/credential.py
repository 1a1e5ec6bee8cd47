"""Telling a revoked site credential from a refusal that passes.

Removing a site (or binding a new key to it) reloads nats-server without the old key: the
site's open connections are closed, and from then on every connection attempt is answered
``Authorization Violation``. nats-py retries that for ever, twice a second. A site process
(agent or pilot) that sees the refusal *persist* says that its credential was revoked,
stops, and exits with its own status (``lode`` maps :class:`CredentialRevoked` to
:data:`EXIT_CREDENTIAL_REVOKED`; docs/operations.md).

One refusal proves nothing. A key is applied by a reload that follows the log (the
projector, then the credential sync, about a second apart), so a site started right
after ``lode site init``, or a cluster whose nodes reload one after the other, may be
refused for a moment and then let in. The rule is therefore: since the first refusal,
no attempt got in, at least :data:`MIN_REFUSALS` attempts were refused, and the refusals
have lasted ``after_s`` (the site's ``nats.revoked_after_s``, 30 s by default: far longer
than a reload takes, and short next to a batch job's wall time). Other failures (NATS
down, a dropped websocket) neither count nor reset: only getting in resets. Counting
attempts as well as time keeps one refusal on either side of a long outage from
looking like a streak.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

import nats.errors

log = logging.getLogger(__name__)

EXIT_CREDENTIAL_REVOKED: Final = 77  # sysexits.h EX_NOPERM: a batch script can test for it
MIN_REFUSALS: Final = 3
# How nats-py reports the server's refusal of a (re)connect: nats.errors.Error("nats:
# 'Authorization Violation'"); its read loop raises AuthorizationError instead.
REFUSAL: Final = "authorization violation"


class CredentialRevoked(Exception):
    """NATS has refused the site's key long enough to call it revoked; the message says so."""


def is_refusal(exc: BaseException) -> bool:
    return isinstance(exc, nats.errors.AuthorizationError) or REFUSAL in str(exc).lower()


class CredentialWatch:
    """Fed every connection error and every successful connect; decides once, for good."""

    def __init__(
        self,
        site: str,
        *,
        after_s: float,
        on_revoked: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.site = site
        self.after_s = after_s
        self.on_revoked = on_revoked  # set by the process once it knows how to stop
        self._clock = clock
        self._since: float | None = None
        self._refusals = 0
        self.revoked = False

    def observe(self, exc: BaseException) -> None:
        """An error the connection reported; only a refusal of the credential counts."""
        if self.revoked or not is_refusal(exc):
            return
        now = self._clock()
        if self._since is None:
            self._since = now
            log.warning("site %s: NATS refused the site's credential (%s); it is revoked "
                        "if that lasts %.0f s", self.site, exc, self.after_s)  # fmt: skip
        self._refusals += 1
        if self._refusals >= MIN_REFUSALS and now - self._since >= self.after_s:
            self.revoked = True
            log.error("%s", self.error())
            if self.on_revoked is not None:
                self.on_revoked()

    def connected(self) -> None:
        """An attempt got in: whatever was refused before was not a revocation."""
        if self._since is not None and not self.revoked:
            log.info("site %s: NATS accepts the site's credential again", self.site)
        self._since = None
        self._refusals = 0

    def error(self) -> CredentialRevoked:
        return CredentialRevoked(
            f"site {self.site}: the site's credential was revoked: NATS refused it on "
            f"{self._refusals} attempts over {self.after_s:.0f} s or more (the site was "
            "removed, or a new key was bound to it); stopping"
        )
