"""Persistence: SQLAlchemy models, sessions and Alembic migrations."""
