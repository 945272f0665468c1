"""One settings module, read from the environment, with defaults that run on a laptop.

Embedded mode (no REDIS_URL): SQLite, the in-memory channel layer, the engine in-process.
Split mode (REDIS_URL set): Redis is the Celery broker and the channel layer; the engine lives
in a separate inference worker.
"""

import os
import secrets
import time
from pathlib import Path

import dj_database_url

from appliance.env import (
    ConfigError,
    envbool,
    envfloat,
    envint,
    envlist,
    envsize,
    envstr,
    envurl,
)

BASE_DIR = Path(__file__).resolve().parent.parent

DATA_DIR = Path(envstr("APPLIANCE_DATA_DIR", str(BASE_DIR / "data"))).resolve()
MODELS_DIR = Path(envstr("MODELS_DIR", str(DATA_DIR / "models"))).resolve()
for _directory in (DATA_DIR, MODELS_DIR):
    try:
        _directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create data directory {_directory}: {exc}") from exc


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated once and kept in the data dir."""
    from_env = envstr("SECRET_KEY")
    if from_env:
        return from_env
    key_file = DATA_DIR / "secret_key"
    try:  # created exclusively: web and workers sharing a data dir may all start at once
        descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
    for _ in range(50):  # another process may be writing it right now
        key = key_file.read_text().strip()
        if key:
            return key
        time.sleep(0.1)
    raise ConfigError(f"{key_file} is empty: delete it or set SECRET_KEY")


SECRET_KEY = _secret_key()
DEBUG = envbool("DEBUG", False)
HOST = envstr("HOST", "127.0.0.1")
PORT = envint("PORT", 8000, lo=1, hi=65535)
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", [])
ADMIN_PASSWORD = envstr("ADMIN_PASSWORD")

REDIS_URL = envstr("REDIS_URL")
SPLIT_MODE = bool(REDIS_URL)

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "inference",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "appliance.urls"
ASGI_APPLICATION = "appliance.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

try:
    DATABASES = {
        "default": dj_database_url.parse(
            envstr("DATABASE_URL", f"sqlite:///{DATA_DIR / 'appliance.sqlite3'}"),
            conn_max_age=0,
        )
    }
except ValueError as exc:
    raise ConfigError(f"DATABASE_URL is not a database URL: {exc}") from exc
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several threads (chat streams, jobs, the web) write at once in embedded mode: WAL lets
    # readers go on beside a writer, IMMEDIATE takes the write lock up front (no failed lock
    # upgrades), and the timeout waits for a busy lock instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        timeout=20,
        transaction_mode="IMMEDIATE",
        init_command="PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    )

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "chat"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise serves from the finders; it only checks this exists
WHITENOISE_USE_FINDERS = True  # serve static/ as is: no collectstatic step on a home box

# Uploads stream to disk in chunks; nothing large is held in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 8 * 1024 * 1024
# The largest body of an endpoint that takes images (chat, responses, messages, Ollama's chat and
# generate, /apply-template: dashboard.api.images): a few full-size camera snapshots in base64.
# Larger is a 413 from the gate, before the body is read.
MAX_IMAGE_BODY_BYTES = envint("MAX_IMAGE_BODY_BYTES", 32 << 20, lo=DATA_UPLOAD_MAX_MEMORY_SIZE,
                              hi=1 << 30)  # fmt: skip
# The largest GGUF POST /api/blobs takes (streamed to disk, never held in memory).
MAX_BLOB_BYTES = envint("MAX_BLOB_BYTES", 512 << 30, lo=1 << 20, hi=1 << 44)
# An uploaded blob that no /api/create made into a model is removed this long after its upload
# (inference.catalog.blobs.prune), as a partial upload that is no longer being written.
BLOB_RETENTION_HOURS = envint("BLOB_RETENTION_HOURS", 24, lo=1, hi=24 * 365)

if SPLIT_MODE:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "capacity": 2000, "expiry": 30},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: only used in split mode. Long inference tasks are acknowledged late so that a request
# whose worker died is redelivered; the visibility timeout sits above the longest task.
CELERY_BROKER_URL = REDIS_URL or "memory://"
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A Redis restart costs only the answers in flight: workers retry the broker for as long as it
# takes, every 2 s (appliance.broker), and a closed connection's late acks read as the lost
# connection they are instead of stopping the worker.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_BROKER_TRANSPORT = "appliance.broker:Transport" if SPLIT_MODE else None
CELERY_WORKER_CONSUMER = "appliance.broker:Consumer"
# Generation goes to queue "inference" (the worker that owns the engine); everything else (model
# import, hashing, downloads, retention) to "jobs". Task names are explicit so routes stay true.
CELERY_TASK_DEFAULT_QUEUE = "jobs"
CELERY_TASK_ROUTES = {
    "inference.generate": {"queue": "inference"},
    "inference.embed": {"queue": "inference"},
    "inference.tokenize": {"queue": "inference"},
}
CELERY_IMPORTS = ["inference.serving.worker", "inference.jobs.tasks"]
CELERY_BEAT_SCHEDULE = {
    "retention": {"task": "inference.prune_request_history", "schedule": 3600.0},
    "blob-retention": {"task": "inference.prune_blobs", "schedule": 3600.0},
    # Workers sweep their own keep-alive; this is the safety net the beat keeps.
    "idle-unload": {"task": "inference.unload_idle_models", "schedule": 60.0},
}

# Engine and product settings.
# 130 ms: on the 2-core box, eight clients' ITL p99 138 ms (a reader at ~5 tokens/s cannot tell
# it from smooth), against 100 ms's 113 ms p99 for 8 % less output and a 46 % later first
# token (README, Benchmarks: the frontier; issue 32).
ITL_TARGET_MS = envint("ITL_TARGET_MS", 130, lo=10, hi=10_000)
# The looser target of steps that carry only background streams (apps, answers nobody reads).
BACKGROUND_ITL_TARGET_MS = envint("BACKGROUND_ITL_TARGET_MS", 1000, lo=10, hi=60_000)
ENGINE_MAX_QUEUE = envint("ENGINE_MAX_QUEUE", 64, lo=1, hi=10_000)
ENGINE_THREADS = envint("ENGINE_THREADS", 0, lo=0, hi=512)  # 0: the model's setting or all cores
MAX_LOADED_MODELS = envint("MAX_LOADED_MODELS", 1, lo=1, hi=64)
DEFAULT_KEEP_ALIVE = envstr("DEFAULT_KEEP_ALIVE", "5m")
# Warm memory (inference.engine.tiers): the box's bounds for kept prompts, in host RAM and on
# disk under DATA_DIR/kv-cache. None ("auto"): sized at start from the machine (a quarter of the
# available RAM, at most 8 GiB; a quarter of the free disk, at most 64 GiB). RAM 0 turns warm
# memory off (prompts stay in their sequence slots only); disk 0 keeps them in RAM only.
PROMPT_CACHE_RAM = envsize("PROMPT_CACHE_RAM")
PROMPT_CACHE_DISK = envsize("PROMPT_CACHE_DISK")
# Speculative decoding (inference.engine.speculation): "auto" drafts where it pays, by measured
# acceptance and step cost (never on free prose on a CPU); "always" wherever a draft exists
# (benchmarks); "off". A model's own setting can turn it off for that model.
SPECULATIVE_DECODING = envstr("SPECULATIVE_DECODING", "auto").strip().lower()
if SPECULATIVE_DECODING not in ("off", "auto", "always"):
    raise ConfigError(f"SPECULATIVE_DECODING must be off, auto or always, got "
                      f"{SPECULATIVE_DECODING!r}")  # fmt: skip
# A restart loads the models that were loaded at the stop again, in the background.
RELOAD_MODELS_AT_START = envbool("RELOAD_MODELS_AT_START", True)
REQUEST_RETENTION_DAYS = envint("REQUEST_RETENTION_DAYS", 30, lo=1, hi=3650)
# Downloads may reach private LAN addresses (10/8, 172.16/12, 192.168/16, fc00::/7, 100.64/10);
# false leaves them only public ones. Loopback, link-local and the appliance's own Redis and
# database are refused either way (inference.catalog.netguard).
DOWNLOAD_ALLOW_PRIVATE = envbool("DOWNLOAD_ALLOW_PRIVATE", True)
# Where /api/pull and the models page's "pull by name" look names up (inference.catalog.pulling): an
# Ollama registry for "model:tag" and "namespace/model:tag", a Hugging Face endpoint (or a
# mirror) for "hf.co/user/repo:quant". Configured here, so trusted wherever they are (a
# registry on this box too); the hosts their blobs redirect to are guarded like any download.
MODEL_REGISTRY_URL = envurl("MODEL_REGISTRY_URL", "https://registry.ollama.ai")
HF_ENDPOINT = envurl("HF_ENDPOINT", "https://huggingface.co")
METRICS_PUBLIC = envbool("METRICS_PUBLIC", False)
TELEMETRY_INTERVAL_S = envfloat("TELEMETRY_INTERVAL_S", 0.5, lo=0.05, hi=60)
API_RATE_LIMIT_PER_MINUTE = envint("API_RATE_LIMIT_PER_MINUTE", 120, lo=1, hi=100_000)
# What one app or one person may hold at once (dashboard.limits).
MAX_STREAMS_PER_KEY = envint("MAX_STREAMS_PER_KEY", 16, lo=1, hi=10_000)
MAX_SOCKETS_PER_USER = envint("MAX_SOCKETS_PER_USER", 8, lo=1, hi=10_000)
# Sign-in throttling (dashboard.web.throttle): failed sign-ins counted per account and per client
# address over LOGIN_LOCKOUT_MINUTES; past either limit sign-ins are refused until it ends.
LOGIN_FAILURES_PER_ACCOUNT = envint("LOGIN_FAILURES_PER_ACCOUNT", 5, lo=1, hi=10_000)
LOGIN_FAILURES_PER_ADDRESS = envint("LOGIN_FAILURES_PER_ADDRESS", 20, lo=1, hi=100_000)
LOGIN_LOCKOUT_MINUTES = envint("LOGIN_LOCKOUT_MINUTES", 15, lo=1, hi=24 * 60)

# Django's cache holds the sign-in throttle's counts. Embedded mode: the local-memory cache,
# which is per process; that is enough, the one web process sees every sign-in (room for many
# entries, so that a flood of made-up user names cannot push a locked account's count out).
# Split mode: Redis, so that every web process counts against the same limits.
if SPLIT_MODE:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "appliance-cache",
        }
    }
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "OPTIONS": {"MAX_ENTRIES": 100_000},
        }
    }
WORKER_NAME = envstr("WORKER_NAME", "")
# Where the inference workers on other boxes reach this web box, to fetch a model's file ("copy
# to box" on a model's page): e.g. http://nas.lan:8000. Unset: the address the staff's browser
# used for the page.
WEB_URL = envurl("WEB_URL", "") if envstr("WEB_URL").strip() else ""

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": envstr("LOG_LEVEL", "INFO")},
    "loggers": {"daphne": {"level": "WARNING"}, "django.channels.server": {"level": "WARNING"},
                "uvicorn": {"level": "WARNING"}},
}
