"""The web console's server side and pages (in a real Chromium where they need one)."""
