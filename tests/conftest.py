"""Shared fixtures: real nats-server and Postgres processes on free loopback ports."""

pytest_plugins = [
    "tests.fixtures.ports",
    "tests.fixtures.nats",
    "tests.fixtures.postgres",
    "tests.fixtures.api",
]
