"""The chat completions door (`/v1/chat/completions`): one call, one Step."""
