"""The worker: stream processors that stitch sessions, judge turns, assemble gated samples,
archive and replay.

The pure logic the stages apply (stitch.py, judging.py, rewards.py, assemble.py, release.py)
knows nothing of Kafka or SQL, so replay runs the very same code over archived events.
"""
