"""What the serving engines serve: gated promotion of candidates and rollback."""
