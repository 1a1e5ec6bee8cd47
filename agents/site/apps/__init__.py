"""Site applications: definitions, loading from ``apps/``, rendering and the Python runner."""

from lodestream.agents.site.apps.definition import ApplicationDefinition, Decision, JobContext
from lodestream.agents.site.apps.errors import (
    AppDefinitionError,
    AppError,
    AppLoadError,
    ParameterError,
    ResultError,
    UnknownApp,
)
from lodestream.agents.site.apps.loader import app_fingerprint, load_apps, to_app_model
from lodestream.agents.site.apps.render import render_command, render_script, resolve_parameters
from lodestream.agents.site.apps.spec import AppSpec, Parameter, TransferSlot

__all__ = [
    "AppDefinitionError",
    "AppError",
    "AppLoadError",
    "AppSpec",
    "ApplicationDefinition",
    "Decision",
    "JobContext",
    "Parameter",
    "ParameterError",
    "ResultError",
    "TransferSlot",
    "UnknownApp",
    "app_fingerprint",
    "load_apps",
    "render_command",
    "render_script",
    "resolve_parameters",
    "to_app_model",
]
