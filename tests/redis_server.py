"""A throwaway ``redis-server`` for the tests (:class:`moot.testing.services.Redis`): on a free loopback
port, its folder a temporary one, nothing saved to disk, stopped at exit or on SIGTERM, or by the next
one to start if its test process was killed (:mod:`moot.testing.throwaway`). Debian's ``redis-server``
package provides it; without it the tests that need Redis fail with one line saying so (the
``redis_server`` fixture in conftest.py), never skip."""

from __future__ import annotations

from moot.testing.services import MISSING_REDIS as MISSING
from moot.testing.services import PROCESS, Redis

PREFIX = Redis.PREFIX

__all__ = ["MISSING", "PREFIX", "PROCESS", "RedisServer"]


class RedisServer(Redis):
    """:class:`Redis` with the tests' words: :meth:`stop` crashes it (SIGKILL, what its clients see of a
    crash; its folder stays), :meth:`close` stops it and removes its folder."""

    def stop(self) -> None:
        self.kill()
