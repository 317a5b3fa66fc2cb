"""The engine's OpenAI-compatible API, laid out as vLLM's `vllm/entrypoints/openai/`: `protocol`
(wire models), one handler per API (`models`, `chat`, `completion`, `classify`), what the chat
and completion handlers share (`generation`), and the routes (`api_router`)."""
