"""End-to-end lane: the services together as a user runs them (`claw-stream up`, gateway, worker
and trainer), killed and restarted under traffic, the real agents from npm, learning, and the
real engine as judge."""
