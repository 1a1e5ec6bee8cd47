"""Errors of site applications.

AppError
├── AppDefinitionError   a class breaks the ApplicationDefinition contract (raised as it is defined)
├── AppLoadError         a file in the site's apps/ directory cannot be loaded: path, line, reason
├── UnknownApp           no app of that name is defined at this site
├── ParameterError       a job's values do not fit the app's parameters (unknown, missing)
└── ResultError          a Python-function app's return value cannot be reported (not JSON)
"""

from __future__ import annotations

from pathlib import Path


class AppError(Exception):
    """Base of site application errors."""


class AppDefinitionError(AppError, TypeError):
    """An ApplicationDefinition subclass is malformed; the message names the class and the fix."""


class AppLoadError(AppError):
    """A file of the apps directory failed to load; ``str()`` is the line to show the operator."""

    def __init__(self, path: Path, line: int | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")


class UnknownApp(AppError, LookupError):
    """A job or command names an app that the site does not define."""


class ParameterError(AppError, ValueError):
    """Parameter values given for a job do not fit the app's declared parameters."""


class ResultError(AppError, TypeError):
    """A Python-function app returned something that cannot travel back as JSON."""
