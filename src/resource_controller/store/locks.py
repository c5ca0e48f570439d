"""The PostgreSQL advisory lock keys, in one place so that none collides."""

#: Migrating the schema: the first controller to start migrates, the others wait.
MIGRATION = 0x7263_0001
#: A scheduling pass: two at once could each rewrite the reservation rows.
SCHEDULING_PASS = 0x7263_0002
# 0x7263_0003 named leadership until the lease row took its place (migration 0013).
#: Presence: every controller holds it shared on its listening connection, so each can
#: count the others (a lone one has nobody to send its wake-ups to).
PRESENT = 0x7263_0004
