"""Test settings: the real settings module, with its data in a fresh temporary directory."""

import os
import tempfile

os.environ.setdefault("APPLIANCE_DATA_DIR", tempfile.mkdtemp(prefix="appliance-test-"))
os.environ.setdefault("ADMIN_PASSWORD", "test-admin-password")
os.environ.pop("REDIS_URL", None)  # embedded mode unless a test builds split mode itself
# Servers and workers the tests start load nothing by themselves; the test of a restart says so.
os.environ.setdefault("RELOAD_MODELS_AT_START", "false")

from appliance.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests

# A file, not SQLite's shared-cache memory database: jobs and streams write from other threads,
# and shared-cache tables fail with "table is locked" instead of waiting for the lock.
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}  # noqa: F405
