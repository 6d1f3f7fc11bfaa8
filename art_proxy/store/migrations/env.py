"""Alembic environment: always handed a live connection by `art_proxy.store.engine.migrate`."""

from __future__ import annotations

from alembic import context

from art_proxy.store.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
