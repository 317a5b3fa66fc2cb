"""The worker's stages, each Faust agent's unit of work over Kafka and Postgres: stitch
(`stitch.py`), judge (`judge.py`), assemble (`assemble.py`) and the sweep (`sweep.py`), over
what they share (`io.py`: the producer, the database, the decoded-step cache, own events)."""
