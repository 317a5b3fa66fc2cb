"""Held-out evaluation of policy versions: score per version in Postgres and Prometheus."""
