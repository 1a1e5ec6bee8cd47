"""``lode analytics report``: an HTML page and its PNG plots. Re-exports only."""

from lodestream.client.analytics.report.write import write_report

__all__ = ["write_report"]
