"""Apps for the end-to-end tests, as a site author writes them."""

from lodestream.agents.site.apps import ApplicationDefinition


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


class Flaky(ApplicationDefinition):
    """Fails on its first attempt, succeeds on the next: exercises handle_error → retry."""

    name = "flaky"
    command_template = (
        'if [ "$LODE_JOB_ATTEMPT" -lt 2 ]; then echo first try fails {{ tag }} >&2; exit 1; fi'
    )


class Square(ApplicationDefinition):
    """A Python-function app: runs in the job's process, its return value comes back."""

    name = "square"
    cleanup_files = ["*.scratch"]

    def run(self, x: str) -> dict[str, int]:
        from pathlib import Path  # noqa: PLC0415 - runs at the site, in the job's process

        Path("work.scratch").write_text("temporary")
        if int(x) < 0:
            raise ValueError(f"negative input {x}")
        return {"square": int(x) ** 2}


class Reduce(ApplicationDefinition):
    """Reads two staged-in inputs and writes an output to stage out."""

    name = "reduce"
    command_template = "mkdir -p out && cat in/raw.txt in/calib/* > out/result.txt"
    transfers = {
        "raw": {"direction": "in", "local_path": "in/raw.txt", "required": True},
        "calib": {"direction": "in", "local_path": "in/calib", "recursive": True},
        "result": {"direction": "out", "local_path": "out/result.txt"},
    }


class Ingest(ApplicationDefinition):
    """Reads one input that many jobs share: the site may serve it from its stage cache."""

    name = "ingest"
    command_template = "wc -c in/frame.dat"
    transfers = {"frame": {"direction": "in", "local_path": "in/frame.dat", "cache": True}}


class Whoami(ApplicationDefinition):
    """Writes its shell's process id: the pid the pilot must report in the run's profile."""

    name = "whoami"
    command_template = "echo $$ > pid.txt"
