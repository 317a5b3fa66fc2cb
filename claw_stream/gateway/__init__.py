"""Gateway: the OpenAI-compatible front door that records every LLM call as a Step on Kafka."""
