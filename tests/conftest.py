"""Shared fixtures: real nats-server, Postgres, Slurm and sshd processes on free loopback ports."""

pytest_plugins = [
    "tests.fixtures.ports",
    "tests.fixtures.nats",
    "tests.fixtures.postgres",
    "tests.fixtures.api",
    "tests.fixtures.slurm",
    "tests.fixtures.sshd",
    "tests.fixtures.docker",
    "tests.fixtures.containers",
    "tests.fixtures.gcstate",
    "tests.fixtures.workers",
]
