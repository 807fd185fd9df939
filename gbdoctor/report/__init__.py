"""Formatters: lay out records, compute nothing (counts come from ``summary``)."""
