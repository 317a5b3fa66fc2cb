"""The worker's state in Postgres, SQL only: the archive (`archive.py`), each session's stitch
state (`segments.py`), turns the judge could not answer yet (`judge_retries.py`) and the sample
outbox (`outbox.py`); `rows.py` carries events in and out of JSONB. What to decide about those
rows lives in the pure rules (`logic/`: `release.py`, `rewards.py`, `turns.py`).

A Faust table lost its newest updates when its worker was SIGKILLed on Tansu, and Tansu has no
transactions; so what must survive a crash lives here. Every write is an idempotent upsert
keyed by an event id, and a session is only touched under its advisory lock, so the stitch
agent, the assemble agent and every worker's sweeper can race without harm.
"""
