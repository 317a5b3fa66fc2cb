"""Anthropic's Messages door (`/v1/messages`, Claude Code): translated to chat and back."""
