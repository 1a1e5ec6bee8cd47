"""Render docs/report/*.png — the report's plots in the user guide (§8) — from a recorded run.

Usage: python tools/report_figures.py [--from-file FILE] [--out DIR]
The run is tests/data/analytics/report-run.jsonl (recorded by
tests/integration/test_analytics_report_run.py with LODE_REPORT_RECORDING set): two
pilots of 2 nodes x 2 cores, sleepers at a steady pace, a chain, retries and two apps that
fail for good with exit codes 3 and 4. Needs the analytics extra (matplotlib). The PNGs
are what ``lode analytics report`` writes beside its index.html, which is left out here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lodestream.client.analytics import Selection, load_file, summarize  # noqa: E402
from lodestream.client.analytics.report import write_report  # noqa: E402

RUN = ROOT / "tests" / "data" / "analytics" / "report-run.jsonl"
OUT = ROOT / "docs" / "report"
LIMIT = 150_000  # bytes a checked-in image may take


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-file", type=Path, default=RUN)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    loaded = load_file(args.from_file, Selection())
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        index = write_report(Path(scratch), summarize(loaded), loaded.timelines)
        for png in sorted(index.parent.glob("*.png")):
            size = png.stat().st_size
            if size > LIMIT:
                print(f"{png.name}: {size:,} bytes, over {LIMIT:,}", file=sys.stderr)
                return 1
            (args.out / png.name).write_bytes(png.read_bytes())
            print(f"{args.out / png.name}: {size:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
