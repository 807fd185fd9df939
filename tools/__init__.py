"""Maintainer scripts run from the repository root (``python -m tools.NAME``)."""
