"""Test settings: the real settings module, with its data in a fresh temporary directory."""

import os
import tempfile

os.environ.setdefault("APPLIANCE_DATA_DIR", tempfile.mkdtemp(prefix="appliance-test-"))
os.environ.setdefault("ADMIN_PASSWORD", "test-admin-password")
os.environ.pop("REDIS_URL", None)  # embedded mode unless a test builds split mode itself

from appliance.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
