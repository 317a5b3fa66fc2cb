"""Postgres store: SQLAlchemy 2 async models, engine factory and Alembic migrations."""
