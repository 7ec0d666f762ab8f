"""The database: migrations and upgrades that keep every row, outages, snapshot reads."""
