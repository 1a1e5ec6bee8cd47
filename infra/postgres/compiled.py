"""Core statements over :mod:`.tables`, compiled once for code that drives psycopg itself.

The controller, the embedded stack's credential sync, the bench and the tests hold plain
psycopg connections (one connection, no pool, no ORM), yet name tables and columns only
through the metadata: a renamed column then fails when the module is imported, not in a
query at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

# The plain dialect puts no casts on parameters (the psycopg dialect adds ``::VARCHAR``), so
# what psycopg receives reads like the hand-written SQL it replaces, and plans the same.
_DIALECT = PGDialect(paramstyle="pyformat")  # type: ignore[no-untyped-call]


@dataclass(frozen=True, slots=True)
class Compiled:
    """SQL with ``%(name)s`` placeholders, and the values that the statement binds itself."""

    sql: sql.SQL
    required: frozenset[str]
    defaults: Mapping[str, Any]

    @classmethod
    def of(cls, statement: ClauseElement) -> Compiled:
        compiled = statement.compile(dialect=_DIALECT)
        assert isinstance(compiled, SQLCompiler)  # a statement, not a DDL element
        required = frozenset(name for name, bind in compiled.binds.items() if bind.required)
        defaults = {name: value for name, value in compiled.params.items() if name not in required}
        # The text comes from the metadata, never from input: safe to hand over as a literal.
        return cls(sql.SQL(str(compiled)), required, defaults)

    def params(self, **values: Any) -> dict[str, Any]:
        """The parameters to execute with: ``values`` fill the statement's placeholders."""
        if values.keys() != self.required:
            raise TypeError(f"parameters {sorted(values)} do not match {sorted(self.required)}")
        return {**self.defaults, **values}
