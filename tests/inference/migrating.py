"""Moving the test database to a migration and back, for tests of data migrations."""

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate(targets):
    """Migrate to `targets` ([(app, migration)]) and return the apps as of then."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def latest():
    """The leaf migrations: where a test puts the database back."""
    return MigrationExecutor(connection).loader.graph.leaf_nodes()
