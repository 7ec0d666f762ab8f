"""The platform's own machines: servers, nodes, backups."""
