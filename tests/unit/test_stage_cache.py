"""The site's stage cache (``agents/site/transfers/stage_cache.py``): keyed by source, fresh
for its TTL, bounded with least recently used out, persistent across agents."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from lodestream.agents.site.transfers.stage_cache import StageCache, cache_key


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def staged(tmp: Path, name: str, size: int) -> Path:
    path = tmp / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def test_a_kept_source_serves_later_jobs_by_link_and_counts_hits(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache", max_bytes=1000, ttl_s=60)
    key = cache_key("dtn", "/exp/raw.h5")
    assert cache.lookup(key) is None
    cache.keep(key, staged(tmp_path, "j1/raw.h5", 100))
    assert cache.lookup(key) == tmp_path / "cache" / key
    destination = tmp_path / "data" / "j2" / "in" / "raw.h5"
    assert cache.serve(key, destination) == 0  # a hard link: no byte written
    assert destination.read_bytes() == b"x" * 100
    assert (cache.hits, cache.misses) == (1, 1)
    assert cache_key("dtn", "/exp/raw.h5") != cache_key("other", "/exp/raw.h5")


def test_an_entry_older_than_its_ttl_is_a_miss_and_is_dropped(tmp_path: Path) -> None:
    clock = Clock()
    cache = StageCache(tmp_path / "cache", max_bytes=1000, ttl_s=60, clock=clock)
    key = cache_key("dtn", "/a")
    cache.keep(key, staged(tmp_path, "a", 10))
    clock.now += 61
    assert cache.lookup(key) is None
    assert not (tmp_path / "cache" / key).exists()


def test_the_least_recently_used_go_first_and_a_file_bigger_than_the_cache_is_not_kept(
    tmp_path: Path,
) -> None:
    clock = Clock()
    cache = StageCache(tmp_path / "cache", max_bytes=250, ttl_s=600, clock=clock)
    keys = [cache_key("dtn", f"/{n}") for n in range(3)]
    for n, key in enumerate(keys):
        clock.now += 1
        cache.keep(key, staged(tmp_path, f"f{n}", 100))
        if n == 1:
            clock.now += 1
            assert cache.lookup(keys[0]) is not None  # 0 is used again: 1 is now the oldest
    assert set(cache.entries) == {keys[0], keys[2]}
    cache.keep(cache_key("dtn", "/huge"), staged(tmp_path, "huge", 1000))
    assert cache_key("dtn", "/huge") not in cache.entries


def test_a_new_agent_finds_what_the_last_one_kept_and_survives_a_damaged_index(
    tmp_path: Path,
) -> None:
    key = cache_key("dtn", "/a")
    StageCache(tmp_path / "cache", max_bytes=1000, ttl_s=600).keep(key, staged(tmp_path, "a", 5))
    assert StageCache(tmp_path / "cache", max_bytes=1000, ttl_s=600).lookup(key) is not None
    (tmp_path / "cache" / "index.json").write_text("{not json")
    assert StageCache(tmp_path / "cache", max_bytes=1000, ttl_s=600).lookup(key) is None


def test_a_zero_bound_is_off(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache", max_bytes=0, ttl_s=600)
    assert not cache.enabled
    cache.keep(cache_key("dtn", "/a"), staged(tmp_path, "a", 5))
    assert cache.entries == {}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.integers(1, 300)), max_size=30))
def test_the_cache_never_holds_more_than_its_bound(uses: list[tuple[int, int]]) -> None:
    import tempfile  # noqa: PLC0415 - a fresh directory per example

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cache = StageCache(root / "cache", max_bytes=500, ttl_s=600)
        for n, size in uses:
            key = cache_key("dtn", f"/{n}")
            if cache.lookup(key) is None:
                cache.keep(key, staged(root, f"{n}-{size}", size))
            assert cache.size <= 500
            on_disk = {p.name for p in (root / "cache").iterdir() if not p.name.startswith(".")}
            assert on_disk - {"index.json"} == set(cache.entries)
