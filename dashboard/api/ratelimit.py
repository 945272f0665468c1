"""Per-key rate limit: a sliding window of the last minute's requests.

Embedded mode keeps the window in this process's memory. Split mode keeps it in Redis (a sorted
set per key, checked and updated by one Lua script, so several web processes share one limit and
two racing requests cannot both take the last slot).
"""

import asyncio
import threading
import time
import uuid
from collections import deque
from typing import Protocol

from django.conf import settings

WINDOW_S = 60.0


class RateLimiter(Protocol):
    async def hit(self, key_id: int) -> float | None:
        """Count one request; None when allowed, else the seconds until a slot frees up."""
        ...


class MemoryRateLimiter:
    def __init__(self, limit: int, window_s: float = WINDOW_S):
        self.limit = limit
        self.window_s = window_s
        self._hits: dict[int, deque[float]] = {}
        self._lock = threading.Lock()

    async def hit(self, key_id: int) -> float | None:
        now = time.monotonic()
        with self._lock:
            hits = self._hits.setdefault(key_id, deque())
            while hits and hits[0] <= now - self.window_s:
                hits.popleft()
            if len(hits) >= self.limit:
                return hits[0] + self.window_s - now
            hits.append(now)  # a refused request does not extend its own wait
            return None


# KEYS[1]: the key's window. ARGV: window in ms, limit, a unique member.
# The server's clock is used so that web processes on different boxes agree.
_SLIDING_WINDOW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], window)
  return -1
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return tonumber(oldest[2]) + window - now
"""


class RedisRateLimiter:
    def __init__(self, url: str, limit: int, window_s: float = WINDOW_S,
                 prefix: str = "appliance:ratelimit:"):  # fmt: skip
        import redis

        self.limit = limit
        self.window_ms = int(window_s * 1000)
        self.prefix = prefix
        self._redis = redis.Redis.from_url(url)
        self._script = self._redis.register_script(_SLIDING_WINDOW_LUA)

    def _hit(self, key_id: int) -> float | None:
        wait_ms = self._script(
            keys=[f"{self.prefix}{key_id}"], args=[self.window_ms, self.limit, uuid.uuid4().hex]
        )
        return None if int(wait_ms) < 0 else max(int(wait_ms), 1) / 1000.0

    async def hit(self, key_id: int) -> float | None:
        return await asyncio.to_thread(self._hit, key_id)


_limiter: RateLimiter | None = None
_limiter_lock = threading.Lock()


def get_limiter() -> RateLimiter:
    global _limiter
    with _limiter_lock:
        if _limiter is None:
            limit = settings.API_RATE_LIMIT_PER_MINUTE
            if settings.SPLIT_MODE:
                _limiter = RedisRateLimiter(settings.REDIS_URL, limit)
            else:
                _limiter = MemoryRateLimiter(limit)
        return _limiter
