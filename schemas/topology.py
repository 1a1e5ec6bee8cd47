"""What each site receives, as data: one row per feed that carries events to a site's processes.

A site never reads the log at large. Events reach it through *feeds* of its own:

    launch-<site>    durable pull consumer   runnable jobs, for its pilots
    process-<site>   durable pull consumer   hook work and finished jobs, for its agent
    sched-<site>     durable pull consumer   pilot batch jobs to submit or delete, for its agent
    xfer-<site>      durable pull consumer   transfer items to stage in or out, for its agent
    kills            live core subscription  kills of its jobs, for its pilots
    peers            live core subscription  its pilots' heartbeats, for its pilots

:data:`SITE_FEEDS` is the one place that says, for each feed, which event types it
carries, who reads it, how the control plane configures it and what the site's key
must be granted to read it. Everything else is derived from it:

* the consumers the controller creates and removes for a site
  (:mod:`lodestream.eventlog.consumers`);
* the site key's nats-server permissions (:mod:`lodestream.infra.nats.auth`): fetch,
  info and ack for each row's durable and nothing else, the kill subjects to subscribe;
* the durable the pilot and the site agent bind to, the subjects a pilot listens on
  for kills, and the event types each accepts as work (``agents/``);
* the generated table in ``docs/permissions.md``.

Adding a feed for a site is adding one row here.
:data:`CONTROLLER` is the control plane's own feed of every site's events, kept beside
them so that every type filter is rendered the same way (:func:`type_filter`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from lodestream.schemas.subjects import EVENTS_STREAM, check_site, type_filter

Reader = Literal["pilot", "site agent"]
"""The site process that reads a feed; both hold the site's one key."""


@dataclass(frozen=True, slots=True)
class Grants:
    """What a site key must be allowed to read one feed."""

    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PullFeed:
    """A durable pull consumer the control plane creates per site (sites never create one).

    Delivery is at-least-once and survives the reader's absence: what is not acked is
    delivered again after ``ack_wait_s``. ``retry_s`` is the reader's settle policy for a
    delivery that met a transient failure (NATS or the scheduler away): handed back (nak)
    for that long (:func:`lodestream.eventlog.kernel.deliveries`).
    """

    purpose: str  # the durable is ``<purpose>-<site>``
    reader: Reader
    event_types: tuple[str, ...]
    description: str
    ack_wait_s: float
    retry_s: float
    max_ack_pending: int = 20_000
    max_waiting: int = 512  # pull requests open at once: one per pilot or agent worker
    stream: str = EVENTS_STREAM

    def durable(self, site: str) -> str:
        return f"{self.purpose}-{check_site(site)}"

    def filter_subjects(self, site: str) -> tuple[str, ...]:
        return tuple(type_filter(check_site(site), t) for t in self.event_types)

    def carries(self, event_type: str) -> bool:
        return event_type in self.event_types

    def grants(self, site: str) -> Grants:
        durable = self.durable(site)
        return Grants(
            publish=(
                # A fetch is a publish to MSG.NEXT whose messages come back on the site's
                # inbox; binding to the durable makes no API call at all (nats-py).
                next_subject(self.stream, durable),
                # The backlog, for sites that look at it.
                f"$JS.API.CONSUMER.INFO.{self.stream}.{durable}",
                # ack, nak and term are publishes to the delivery's reply subject.
                f"$JS.ACK.{self.stream}.{durable}.>",
            )
        )


@dataclass(frozen=True, slots=True)
class LiveFeed:
    """A core subscription to the site's own subjects: heard at once, but only while
    connected, and never replayed. Its reader must make up for what it missed itself."""

    purpose: str
    reader: Reader
    event_types: tuple[str, ...]
    description: str
    # The site's heartbeats (``hb.<site>.*``) instead of events: they are not on the log.
    heartbeats: bool = False

    def filter_subjects(self, site: str) -> tuple[str, ...]:
        if self.heartbeats:
            return (f"hb.{check_site(site)}.*",)
        return tuple(type_filter(check_site(site), t) for t in self.event_types)

    def carries(self, event_type: str) -> bool:
        return event_type in self.event_types

    def grants(self, site: str) -> Grants:
        return Grants(subscribe=self.filter_subjects(site))


SiteFeed = PullFeed | LiveFeed

LAUNCH: Final = PullFeed(
    "launch", "pilot",
    ("job.created", "job.preprocessed", "job.restart_ready", "job.lease_released",
     "job.lease_expired", "job.placement_refused"),
    "runnable jobs: each carries the work to run; every job.created, of which pilots run "
    "those created runnable and ack the others", ack_wait_s=30.0, retry_s=0.5,
)  # fmt: skip
"""``job.created`` is here because a job created runnable goes to pilots with no hop
between (a subject filter cannot tell it from the others: the pilot does, see
``agents/launcher/work.py``)."""
PROCESS: Final = PullFeed(
    "process", "site agent",
    ("job.staged_in", "job.run_done", "job.run_errored", "job.run_timed_out", "job.finished"),
    "hook work (preprocess, postprocess, errors, timeouts); finished jobs for the cleaner",
    ack_wait_s=60.0, retry_s=1.0,
)  # fmt: skip
SCHED: Final = PullFeed(
    "sched", "site agent", ("batch.requested", "batch.deletion_requested"),
    "pilot batch jobs to submit and to delete; a request is held (in progress) while its "
    "batch job lives, so an agent that dies hands its batch jobs to the next",
    ack_wait_s=120.0, retry_s=10.0, max_ack_pending=10_000, max_waiting=64,
)  # fmt: skip
XFER: Final = PullFeed(
    "xfer", "site agent", ("xfer.requested",),
    "transfer items to stage in or out; a request is held (in progress) until its item has "
    "succeeded or failed, so an agent that dies hands its transfers to the next",
    ack_wait_s=120.0, retry_s=5.0, max_ack_pending=20_000, max_waiting=64,
)  # fmt: skip
KILLS: Final = LiveFeed(
    "kills", "pilot", ("job.killed",),
    "kills of running jobs; a pilot also re-checks its jobs for a kill it did not hear",
)  # fmt: skip

PEERS: Final = LiveFeed(
    "peers", "pilot", (),
    "the site's pilot heartbeats: which inputs each pilot's node caches hold, so that a job "
    "is offered first to a pilot that holds its inputs (data-aware dispatch)",
    heartbeats=True,
)  # fmt: skip

SITE_FEEDS: Final[tuple[SiteFeed, ...]] = (LAUNCH, PROCESS, SCHED, XFER, KILLS, PEERS)
"""Every feed of every site. A consumer or grant for a site that is not a row here is a bug."""

SITE_CONSUMERS: Final = tuple(feed for feed in SITE_FEEDS if isinstance(feed, PullFeed))
"""The rows the control plane creates a durable consumer for, at every site."""


def site_grants(site: str) -> Grants:
    """What ``site``'s key needs to read all its feeds, in table order."""
    grants = [feed.grants(site) for feed in SITE_FEEDS]
    return Grants(
        publish=tuple(s for g in grants for s in g.publish),
        subscribe=tuple(s for g in grants for s in g.subscribe),
    )


def next_subject(stream: str, durable: str) -> str:
    """The JetStream API subject a pull request for ``durable`` is published to."""
    return f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"


@dataclass(frozen=True, slots=True)
class ControlFeed:
    """What a control-plane consumer receives of *every* site's events."""

    event_types: tuple[str, ...]
    kinds: tuple[str, ...] = ()  # whole aggregates: every event of these kinds

    def filter_subjects(self) -> list[str]:
        return [type_filter("*", t) for t in self.event_types] + [
            f"evt.*.{kind}.>" for kind in self.kinds
        ]

    def carries(self, event_type: str) -> bool:
        return event_type in self.event_types


CONTROLLER: Final = ControlFeed(
    event_types=(
        *(f"job.{name}" for name in (
            "created", "awaiting_parents", "ready", "finished", "failed", "killed", "run_done",
            "postprocessed", "staged_out", "reset",
        )),
        "xfer.succeeded", "xfer.failed",
    ),
    kinds=("app", "site"),  # the apps it needs to decide, the sites it provides feeds for
)  # fmt: skip
"""The controller's feed: the job events it decides on, the transfer items' outcomes (a job's
staging step ends with its last item), and every app and site event."""
