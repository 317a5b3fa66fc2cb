"""The worker: stream processors that stitch sessions, judge turns, assemble gated samples,
archive and re-derive.

`logic/` holds the pure rules the stages apply (turns, judge prompts, rewards, samples,
release); they know nothing of Kafka or SQL, so `claw-stream replay` (`rederive.py`) runs the
very same code over archived events. `stages/` holds each Faust agent's unit of work over Kafka
and Postgres, `state/` the SQL they keep; `judge_client.py` asks the judge over HTTP,
`prompt_files.py` loads its prompts, `app.py` is the Faust app and `worker.py` its routes.
"""
