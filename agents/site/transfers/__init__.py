"""The site's transfer module: stage jobs' files in and out through the site's backends."""

from lodestream.agents.site.transfers.module import TransferModule

__all__ = ["TransferModule"]
