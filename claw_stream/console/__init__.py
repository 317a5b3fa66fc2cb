"""The console: a browser view of sessions, turns, versions and lag, with the same actions as
the session API and the CLI (served by the gateway at /console, or alone: `claw-stream console`)."""
