"""The fast lane (`make test-fast`): no broker, no Postgres, no model; all of it in under 60 s."""
