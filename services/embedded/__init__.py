"""The embedded single-machine stack behind ``lode up``."""

from lodestream.services.embedded.stack import EmbeddedStack, StackInfo, StackPorts

__all__ = ["EmbeddedStack", "StackInfo", "StackPorts"]
