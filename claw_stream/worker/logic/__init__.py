"""The worker's pure rules, no Kafka, SQL or HTTP: a session's steps into turns (`turns.py`),
judge prompts and their answers (`judge_prompts.py`), rewards (`rewards.py`), samples
(`samples.py`) and their release (`release.py`). `claw-stream replay` (`rederive.py`) runs
the very same code over archived events."""
