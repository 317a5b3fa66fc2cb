"""Tests against the real Tansu broker, embedded PostgreSQL, built-in engine and Faust workers."""
