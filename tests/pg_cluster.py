"""A throwaway PostgreSQL cluster for the tests (:class:`moot.testing.services.Postgres`): ``initdb`` in
a temporary folder, on a free loopback port, as the ``postgres`` user when the tests run as root
(PostgreSQL refuses root), stopped at exit or on SIGTERM, or by the next one to start if its test
process was killed (:mod:`moot.testing.throwaway`). Debian's ``postgresql`` package provides the
programs (``tools/services.sh up`` installs it); without them the tests that need PostgreSQL fail with
one line saying so (the ``pg_cluster`` fixture in conftest.py), never skip."""

from __future__ import annotations

from moot.testing.services import MISSING_POSTGRES as MISSING
from moot.testing.services import Postgres as PgCluster
from moot.testing.services import pg_bin

PREFIX = PgCluster.PREFIX

__all__ = ["MISSING", "PREFIX", "PgCluster", "pg_bin"]
