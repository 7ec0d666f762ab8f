"""Request signing (shared by server and SDK) and credentials."""
