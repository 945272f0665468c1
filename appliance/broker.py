"""The Celery broker in split mode: kombu's Redis transport and Celery's consumer, made to ride
out a Redis restart. Redis going away must cost only the answers in flight; every worker
reconnects by itself and serves again within seconds of Redis being back.

- Transport: kombu closes a lost connection's transport (its `client` becomes None) while
  channels of that connection may still be closed, acked on, or restore their unacked messages
  afterwards; each of those builds a new Redis pool from the transport's client and raised
  AttributeError, which Celery's consumer does not take for a lost connection: the worker
  stopped ("Unrecoverable error"). Here it is the redis.ConnectionError it stands for, which
  Celery logs and recovers from like any other loss.
- Consumer: Celery retries the broker connection 2, 4, 6 ... up to 30 s apart, so after a long
  outage a worker could sit idle for 30 s with Redis back; it retries every
  RECONNECT_INTERVAL_S instead (one connection attempt per worker, cheap for Redis).

Both are named in settings (CELERY_BROKER_TRANSPORT, CELERY_WORKER_CONSUMER).
"""

from functools import partial

import redis
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.transport import redis as kombu_redis

RECONNECT_INTERVAL_S = 2.0


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> dict:
        if self.connection.client is None:
            raise redis.ConnectionError("the connection to the broker was closed")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel


class Consumer(CeleryConsumer):
    def ensure_connected(self, conn):
        conn.ensure_connection = partial(
            conn.ensure_connection,
            interval_start=RECONNECT_INTERVAL_S,
            interval_step=0,
            interval_max=RECONNECT_INTERVAL_S,
        )
        return super().ensure_connected(conn)
