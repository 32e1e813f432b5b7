"""Declarative compliance rules evaluated on user and item attributes (fail closed)."""
