"""The trajectory store: SQLAlchemy Core tables, Alembic migrations, group-committed writes."""
