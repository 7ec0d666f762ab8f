"""Alembic environment: runs on the connection Kiln hands over (see kiln.db.migrate)."""

from alembic import context

from kiln.db.tables import Base

config = context.config
connection = config.attributes["connection"]
if connection.dialect.name == "sqlite" and connection.exec_driver_sql("PRAGMA foreign_keys").scalar():
    # A table rebuilt with foreign keys enforced deletes the rows referencing it (ON DELETE CASCADE): every run
    # goes through kiln.db.migrate, which turns them off for the migration and checks the references after.
    raise RuntimeError("migrations on SQLite run with foreign keys off: use kiln.db.migrate.upgrade/downgrade")
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    # kiln.db.migrate's progress: it logs each revision as it ends and the next as it begins.
    on_version_apply=config.attributes.get("on_version_apply"),
)
with context.begin_transaction():
    context.run_migrations()
