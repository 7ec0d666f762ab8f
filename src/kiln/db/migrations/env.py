"""Alembic environment: runs on the connection Kiln hands over (see kiln.db.migrate)."""

from alembic import context

from kiln.db.tables import Base

config = context.config
connection = config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
