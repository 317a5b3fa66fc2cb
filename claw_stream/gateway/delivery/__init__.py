"""How a Step reaches the broker: acks=all, else an fsync'd spool; the archive checked."""
