"""Embedded runtime: the whole stack on one machine with no Docker and no JVM."""
