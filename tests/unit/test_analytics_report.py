"""``lode analytics report``: index.html parses, has every section and table of the summary,
and references each PNG, which exists and is a real, non-empty image (no pixel is asserted)."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from lodestream.client.analytics.report import write_report
from lodestream.client.analytics.summary import summarize
from tests.support.analytics import hand_log

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS = {"states.png", "throughput.png", "utilization.png", "pilots.png", "latency.png",
         "failures.png", "backlog.png"}  # fmt: skip
SECTIONS = ["Jobs in each state", "Throughput", "Utilization", "Pilot timelines",
            "Stage latencies", "Pilot overhead", "Little's law", "Failures", "Backlog"]  # fmt: skip
CAPTIONS = {
    "Headline figures", "Overview", "Table 1: stage latencies of finished jobs (seconds)",
    "Pilot overhead per run (seconds)", "Little's law per site (L = λW)",
    "Failures by app, exit code and first stderr line", "Failures by cause chain",
}  # fmt: skip


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.captions: list[str] = []
        self.cells: list[str] = []
        self.headings: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs)["src"] or "")
        self._in = tag

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "caption":
            self.captions.append(data)
        elif self._in == "td":
            self.cells.append(data)
        elif self._in == "h2":
            self.headings.append(data)


def test_the_report_renders_every_plot_and_table(tmp_path: Path) -> None:
    loaded = hand_log().loaded()
    index = write_report(tmp_path / "report", summarize(loaded, bin_s=20), loaded.timelines)
    assert index == tmp_path / "report" / "index.html"
    page = Page()
    page.feed(index.read_text())
    page.close()
    assert set(page.images) == PLOTS
    for name in PLOTS:
        png = index.parent / name
        assert png.stat().st_size > 1000, name
        assert png.read_bytes()[:8] == PNG_SIGNATURE, name
    assert page.headings == SECTIONS
    assert set(page.captions) >= CAPTIONS
    assert any(c.startswith("Throughput: jobs entering each state per") for c in page.captions)
    assert any(c.startswith("Utilization: nodes, mean per") for c in page.captions)
    # Table 1's time to solution row: 3 jobs, 36 ± 12 s, p50 36 s, p95 48 s.
    row = page.cells[page.cells.index("time to solution") :][:6]
    assert row == ["time to solution", "CREATED → JOB_FINISHED", "3", "36.000 ± 12.000",
                   "36.000", "48.000"]  # fmt: skip


def test_what_sites_wrote_is_escaped_in_the_page(tmp_path: Path) -> None:
    log = hand_log()
    job = log.created(61)
    log.failed(job, 62, "<script>alert(1)</script>")
    loaded = log.loaded()
    index = write_report(tmp_path, summarize(loaded), loaded.timelines)
    text = index.read_text()
    assert "<script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
