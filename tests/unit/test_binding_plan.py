"""The credential sync's plan: what nats-server may get, checked before it is rendered."""

from __future__ import annotations

from lodestream.schemas.nkey import new_user_seed, user_public_key
from lodestream.services.embedded.bindings import Binding, plan


def key() -> str:
    return user_public_key(new_user_seed())


def accept(binding: Binding) -> None:
    """Every entry renders on its own."""


def test_a_key_held_twice_goes_to_the_principal_it_is_bound_to() -> None:
    shared = key()
    site = Binding("site", "alpha", shared)
    monitor = Binding("monitor", "bob", shared, ("beta",))
    other = Binding("site", "beta", key())

    result = plan([monitor, site, other], {shared: ("site", "alpha")}, (), accept)

    assert result.usable == tuple(sorted([site, other]))
    assert list(result.rejects) == [monitor]
    assert "also bound to a site" in result.rejects[monitor]


def test_a_key_held_twice_and_bound_to_neither_goes_to_nobody() -> None:
    shared = key()
    one, two = Binding("site", "one", shared), Binding("site", "two", shared)

    result = plan([one, two], {}, (), accept)

    assert result.usable == ()
    assert set(result.rejects) == {one, two}


def test_a_bad_key_and_the_control_planes_key_are_left_out() -> None:
    good = key()
    broken = good[:-1] + ("A" if good[-1] != "A" else "B")
    control = key()
    bad, reserved, fine = (
        Binding("site", "bad", broken),
        Binding("monitor", "eve", control),
        Binding("site", "fine", good),
    )

    result = plan([bad, reserved, fine], {}, {control}, accept)

    assert result.usable == (fine,)
    assert "checksum" in result.rejects[bad]
    assert "control plane" in result.rejects[reserved]


def test_an_entry_that_does_not_render_is_left_out() -> None:
    entry = Binding("site", "odd", key())

    def refuse(binding: Binding) -> None:
        raise ValueError("does not render")

    assert plan([entry], {}, (), refuse).rejects == {entry: "does not render"}
