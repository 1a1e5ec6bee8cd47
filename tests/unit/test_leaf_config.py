"""The leaf node's config and a leaf site's grants, rendered from the same tables as the rest."""

from __future__ import annotations

from pathlib import Path

from lodestream.eventlog.outbox import event_subject, expected, outbox_subject
from lodestream.infra.nats.auth import render_authorization, site_permissions
from lodestream.infra.nats.config import render_config
from lodestream.infra.nats.leaf import example_config
from lodestream.schemas.subjects import type_filter
from lodestream.schemas.trust import WRITERS

EXAMPLE = Path(__file__).parents[2] / "infra" / "nats" / "examples" / "leaf" / "leaf.conf"


def test_the_shipped_leaf_template_is_current() -> None:
    assert EXAMPLE.read_text() == render_config(example_config())


def test_the_leaf_has_its_site_domain_and_dials_the_hub_over_wss() -> None:
    text = render_config(example_config())
    assert 'domain: "alpha"' in text
    assert 'urls: ["wss://hub.example.org:443"]' in text
    assert "tls { ca_file:" in text


def test_a_site_without_a_leaf_keeps_its_grants() -> None:
    assert site_permissions("alpha") == site_permissions("alpha", leaf_domain=None)
    assert "deny" not in site_permissions("alpha")["publish"]


def test_a_leaf_site_may_not_publish_a_control_type_and_reaches_only_its_own_subjects() -> None:
    grants = site_permissions("alpha", leaf_domain="hub")
    allow, deny = grants["publish"]["allow"], grants["publish"]["deny"]
    control = [t for t, writers in WRITERS.items() if "site" not in writers]
    assert {type_filter("alpha", t) for t in control} == set(deny)
    assert type_filter("alpha", "job.created") in deny
    assert "evt.alpha.>" in allow
    assert not [s for s in allow if s.startswith("evt.") and not s.startswith("evt.alpha.")]
    assert "$JS.hub.API.CONSUMER.MSG.NEXT.EVENTS.launch-alpha" in allow
    assert "$JS.ACK.*.*.EVENTS.launch-alpha.>" in allow
    assert "$JS.hub.API.DIRECT.GET.EVENTS.evt.alpha.>" in allow
    assert grants["subscribe"] == site_permissions("alpha")["subscribe"]


def test_only_leaf_sites_may_connect_a_leaf_node() -> None:
    key = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"
    text = render_authorization("lodestream", "pw", {"alpha": key}, leaf_sites=["alpha"],
                                leaf_domain="hub")  # fmt: skip
    assert '["WEBSOCKET", "LEAFNODE_WS"]' in text
    plain = render_authorization("lodestream", "pw", {"alpha": key})
    assert "LEAFNODE" not in plain


def test_an_outboxed_event_keeps_its_subject_and_its_compare_and_set() -> None:
    subject = "evt.alpha.job.0193.finished"
    assert event_subject(outbox_subject(subject)) == subject
    assert expected({"Lode-Expected-Last-Subject-Sequence": "42"}) == 42
    assert expected(None) is None
