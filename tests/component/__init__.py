"""Component lane: one service (or its parts in-process) against the real Tansu broker, embedded
PostgreSQL, the built-in engine and Faust workers; judges and upstreams it cannot run here are
stubs that speak their real protocol."""
