"""The chaos test's app: records every start in its workdir, then runs briefly."""

from lodestream.agents.site.apps import ApplicationDefinition


class ChaosMarker(ApplicationDefinition):
    """One line in ``runs.log`` per start (written first, so a run killed later still counts)."""

    name = "chaos"
    command_template = 'echo "attempt $LODE_JOB_ATTEMPT" >> runs.log; sleep {{ seconds }}'
    parameters = {"seconds": {"default": "0.5"}}
