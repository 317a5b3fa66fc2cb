"""Stream processors: stitch sessions, judge turns, assemble gated samples, archive, replay.

This package holds the pure logic the Faust agents apply; it knows nothing of Kafka, so replay
runs the very same code over archived events.
"""
