"""Alembic environment: migrations run on the connection the store hands over."""

from __future__ import annotations

from alembic import context

from resource_controller.store import schema

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=schema.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
