"""The per-key sliding window: in memory (embedded mode) and in Redis (split mode, shared by
several web processes)."""

import asyncio
import uuid

import pytest

from dashboard.api.ratelimit import MemoryRateLimiter, RedisRateLimiter

REDIS_URL = "redis://127.0.0.1:6379/9"  # this test module's own database number


async def test_the_memory_window_refuses_past_the_limit_per_key():
    limiter = MemoryRateLimiter(limit=2, window_s=60)
    assert await limiter.hit(1) is None
    assert await limiter.hit(1) is None
    wait = await limiter.hit(1)
    assert wait is not None and 0 < wait <= 60
    assert await limiter.hit(2) is None  # another key has its own window


async def test_the_memory_window_slides():
    limiter = MemoryRateLimiter(limit=1, window_s=0.2)
    assert await limiter.hit(1) is None
    assert await limiter.hit(1) is not None
    await asyncio.sleep(0.25)
    assert await limiter.hit(1) is None


@pytest.fixture
def redis_prefix():
    import redis

    prefix = f"test-api-ratelimit:{uuid.uuid4().hex}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)


@pytest.mark.redis
async def test_two_web_processes_share_one_redis_window(redis_prefix):
    first = RedisRateLimiter(REDIS_URL, limit=3, prefix=redis_prefix)
    second = RedisRateLimiter(REDIS_URL, limit=3, prefix=redis_prefix)
    results = [await limiter.hit(7) for limiter in (first, second, first)]
    assert results == [None, None, None]
    wait = await second.hit(7)
    assert wait is not None and 0 < wait <= 60
    assert await first.hit(8) is None


@pytest.mark.redis
async def test_concurrent_hits_never_take_more_than_the_limit(redis_prefix):
    limiter = RedisRateLimiter(REDIS_URL, limit=5, prefix=redis_prefix)
    results = await asyncio.gather(*(limiter.hit(1) for _ in range(20)))
    assert sum(r is None for r in results) == 5
