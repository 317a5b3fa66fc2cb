"""OpenAI's Responses door (`/v1/responses`, Codex): translated to chat and back."""
