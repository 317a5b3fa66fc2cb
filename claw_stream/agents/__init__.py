"""The coding agents claw-stream works with, for the CLI and the gateway alike.

- `names`: the agents by name (imports nothing: the CLI's --help reads it);
- `recognition`: which agent sent a call to the gateway, and what it says of its session;
- `connect`: `claw-stream connect`, our provider merged into an agent's own config file, with
  one module per agent's file (`claude_code`, `codex`, `openclaw`, `zeroclaw`, `opencode`,
  `aider`, `hermes`, `gemini`), what they share (`target`), and in-place edits of JSON with
  comments (`jsonc`) and YAML (`yaml_doc`);
- `doctor`: `claw-stream doctor`, a running stack checked as an agent uses it.
"""
