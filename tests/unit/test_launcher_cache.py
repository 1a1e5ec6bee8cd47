"""Node-local caches (``agents/launcher/cache_index.py``, ``cache.py``): keys, the LRU bound
as an invariant, pins, hit and miss accounting, and the workdir put back after a job."""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from lodestream.agents.launcher.cache import (
    CachedInput,
    NodeCache,
    PilotCache,
    cacheable_inputs,
    wanted_sources,
)
from lodestream.agents.launcher.cache_index import LruIndex, cache_key, source_id
from lodestream.schemas.resources import App, AppTransferSlot, JobSpec, TransferSpec

# --- keys ---------------------------------------------------------------------------------


def test_a_source_is_named_by_its_location_and_path_only() -> None:
    assert source_id("beamline", "/a/b.h5") == source_id("beamline", "/a/b.h5")
    assert source_id("beamline", "/a/b.h5") != source_id("scratch", "/a/b.h5")
    assert source_id("beam", "line/x") != source_id("beamline", "/x")  # no ambiguous join
    assert len(source_id("x", "y")) == 16


def test_a_new_size_or_mtime_is_a_new_key() -> None:
    base = cache_key("s", 10, 1)
    assert base == cache_key("s", 10, 1)
    assert len({base, cache_key("s", 11, 1), cache_key("s", 10, 2), cache_key("t", 10, 1)}) == 4


# --- the index ----------------------------------------------------------------------------


def test_least_recently_used_goes_first() -> None:
    index = LruIndex(30)
    for key in "abc":
        assert index.admit(key, key, 10) == []
    assert index.touch("a")
    assert index.admit("d", "d", 10) == ["b"]  # a was used after b
    assert sorted(k for k in "abcd" if k in index) == ["a", "c", "d"]
    assert index.sources(10) == ("d", "a", "c")


def test_pinned_entries_are_never_evicted() -> None:
    index = LruIndex(20)
    index.admit("a", "a", 10)
    index.admit("b", "b", 10)
    index.pin("a")
    assert index.admit("c", "c", 10) == ["b"]
    index.pin("c")
    assert index.admit("d", "d", 10) is None  # everything left is pinned
    assert "d" not in index
    assert index.total_bytes == 20
    index.unpin("a")
    assert index.admit("d", "d", 10) == ["a"]


def test_an_entry_bigger_than_the_cache_is_refused() -> None:
    index = LruIndex(5)
    assert index.admit("a", "a", 6) is None
    assert len(index) == 0
    assert index.total_bytes == 0


ops = st.lists(
    st.tuples(
        st.sampled_from(["admit", "pin", "unpin", "touch"]), st.integers(0, 7), st.integers(0, 40)
    ),
    max_size=80,
)


@given(capacity=st.integers(0, 100), steps=ops)
def test_the_bound_holds_and_pins_survive_whatever_happens(
    capacity: int, steps: list[tuple[str, int, int]]
) -> None:
    index = LruIndex(capacity)
    sizes: dict[str, int] = {}
    pins: dict[str, int] = {}
    for op, n, size in steps:
        key = f"k{n}"
        if op == "admit":
            evicted = index.admit(key, key, sizes.get(key, size))
            if evicted is not None:
                sizes.setdefault(key, size)
                assert not any(pins.get(v, 0) for v in evicted)
                for victim in evicted:
                    pins.pop(victim, None)
        elif op == "pin" and key in index:
            index.pin(key)
            pins[key] = pins.get(key, 0) + 1
        elif op == "unpin":
            index.unpin(key)
            if pins.get(key):
                pins[key] -= 1
        else:
            index.touch(key)
        assert index.total_bytes <= capacity
        held = [k for k in sizes if k in index]
        assert index.total_bytes == sum(sizes[k] for k in held)
        assert all(k in index for k, count in pins.items() if count)


# --- files --------------------------------------------------------------------------------


def staged(workdir: Path, name: str, size: int) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / name
    path.write_bytes(b"x" * size)
    return path


def test_a_miss_copies_once_and_a_hit_copies_nothing(tmp_path: Path) -> None:
    cache = NodeCache("n0", tmp_path / "cache" / "n0", capacity=1000)
    src = source_id("loc", "/in.dat")
    first = staged(tmp_path / "w1", "in.dat", 100)
    second = staged(tmp_path / "w2", "in.dat", 100)
    os.utime(second, ns=(first.stat().st_mtime_ns, first.stat().st_mtime_ns))  # as rsync -t

    use = cache.provide("j1", [CachedInput(src, first)])
    assert (use.hits, use.misses, use.bytes_copied, use.bypassed) == (0, 1, 100, 0)
    use = cache.provide("j2", [CachedInput(src, second)])
    assert (use.hits, use.misses, use.bytes_copied) == (1, 0, 0)

    # The job reads the node's copy, read-only; the shared one is set aside meanwhile.
    assert second.is_symlink()
    assert second.resolve().parent == cache.root
    assert second.read_bytes() == b"x" * 100
    assert not second.resolve().stat().st_mode & 0o222
    cache.release("j2")
    assert not second.is_symlink()
    assert second.read_bytes() == b"x" * 100
    assert sorted(p.name for p in second.parent.iterdir()) == ["in.dat"]


def test_another_version_of_a_source_is_a_miss(tmp_path: Path) -> None:
    cache = NodeCache("n0", tmp_path / "c", capacity=1000)
    src = source_id("loc", "/in.dat")
    cache.provide("j1", [CachedInput(src, staged(tmp_path / "w1", "in.dat", 100))])
    use = cache.provide("j2", [CachedInput(src, staged(tmp_path / "w2", "in.dat", 120))])
    assert (use.hits, use.misses, use.bytes_copied) == (0, 1, 120)


def test_no_room_or_no_file_is_bypassed_never_an_error(tmp_path: Path) -> None:
    cache = NodeCache("n0", tmp_path / "c", capacity=150)
    a = staged(tmp_path / "w1", "a", 100)
    b = staged(tmp_path / "w2", "b", 100)
    assert cache.provide("j1", [CachedInput("a" * 16, a)]).misses == 1
    # a is pinned by j1: b does not fit beside it, so j2 reads its shared copy.
    use = cache.provide("j2", [CachedInput("b" * 16, b)])
    assert (use.misses, use.bypassed) == (0, 1)
    assert not b.is_symlink()
    assert cache.provide("j3", [CachedInput("c" * 16, tmp_path / "absent")]).bypassed == 1
    cache.release("j1")
    only = cache_key("b" * 16, 100, b.stat().st_mtime_ns)
    use = cache.provide("j4", [CachedInput("b" * 16, b)])
    assert use.misses == 1
    assert cache.total_bytes == 100
    assert sorted(p.name for p in cache.root.iterdir()) == [only]


def test_a_workdir_left_linked_by_a_dead_pilot_is_restored(tmp_path: Path) -> None:
    first = NodeCache("n0", tmp_path / "c1", capacity=1000)
    path = staged(tmp_path / "w", "in.dat", 10)
    first.provide("j1", [CachedInput("s" * 16, path)])  # never released: the pilot died
    second = NodeCache("n0", tmp_path / "c2", capacity=1000)
    use = second.provide("j1", [CachedInput("s" * 16, path)])
    assert use.misses == 1
    assert path.resolve().parent == second.root


def test_pilot_cache_ranks_nodes_and_digests_sources(tmp_path: Path) -> None:
    pilot = PilotCache(tmp_path / "session", ["n0", "n1"], capacity_per_node=1000)
    pilot.nodes["n1"].provide(
        "j",
        [
            CachedInput("a" * 16, staged(tmp_path / "w", "a", 5)),
            CachedInput("b" * 16, staged(tmp_path / "w", "b", 5)),
        ],
    )
    pilot.nodes["n0"].provide("k", [CachedInput("a" * 16, staged(tmp_path / "v", "a", 5))])
    assert pilot.holders(frozenset({"a" * 16, "b" * 16})) == ["n1", "n0"]
    assert pilot.holders(frozenset({"z" * 16})) == []
    assert pilot.held(frozenset({"a" * 16, "b" * 16})) == 2
    assert set(pilot.digest()) == {"a" * 16, "b" * 16}
    pilot.close()
    assert not (tmp_path / "session").exists()


def test_only_single_file_inputs_of_cacheable_slots_are_cached(tmp_path: Path) -> None:
    app = App(site="alpha", name="reader", transfers={
        "ref": AppTransferSlot(direction="in", local_path="ref.dat", cache=True),
        "tree": AppTransferSlot(direction="in", local_path="tree", cache=True),
        "own": AppTransferSlot(direction="in", local_path="own.dat"),
        "out": AppTransferSlot(direction="out", local_path="out.dat"),
    })  # fmt: skip
    job = JobSpec(site="alpha", app="reader", workdir="runs/1", transfers={
        "ref": TransferSpec(location="beam", path="/ref.dat"),
        "tree": TransferSpec(location="beam", path="/tree", recursive=True),
        "own": TransferSpec(location="beam", path="/own.dat"),
        "out": TransferSpec(location="beam", path="/out.dat"),
    })  # fmt: skip
    assert cacheable_inputs(app, job, tmp_path) == (
        CachedInput(source_id("beam", "/ref.dat"), tmp_path / "runs/1/ref.dat"),
    )
    assert wanted_sources(app, job) == {source_id("beam", "/ref.dat")}
    assert cacheable_inputs(None, job, tmp_path) == ()
