"""Apps for the end-to-end tests, as a site author writes them."""

from agents.site.apps import ApplicationDefinition


class Hello(ApplicationDefinition):
    """Writes a greeting into its workdir."""

    name = "hello"
    command_template = "printf 'hello %s\\n' {{ who }} > greeting.txt"
    parameters = {"who": {"default": "world"}}


class Sleeper(ApplicationDefinition):
    """Sleeps; for fencing and drain tests."""

    name = "sleeper"
    command_template = "sleep {{ seconds }}"


class Fails(ApplicationDefinition):
    """Exits non-zero with a message on stderr."""

    name = "fails"
    command_template = "echo {{ why }} >&2; exit 3"
