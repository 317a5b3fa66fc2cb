"""A weight version's lifecycle, from the trainer's checkpoint to the version a policy serves.

- `records`: its row in weight_versions (one upsert, one rule) and what Postgres says of it;
- `numbering`: the number a new version gets; `checkpoints`: where its checkpoint is, and
  which pruning keeps;
- `push`: loading it on the engines (full weights or a LoRA adapter); `announce`: recorded,
  then published on claw.weights;
- `serving_view`: which version a policy serves; `following`: the trainer going on from it;
- `promotion`: a gated candidate evaluated, then served or rejected; `watchdog`: a rollback
  when new versions do worse on held-out; `rollback`: an older version served again;
- `evaluate_each`: `claw-stream eval --follow`, each version evaluated as it is announced;
- `config`: the settings section `serving:`.
"""


class ServingError(RuntimeError):
    """A version cannot be served; the message says which and why."""
