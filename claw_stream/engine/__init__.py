"""Built-in inference engine: transformers/torch with continuous batching, speaking vLLM's dialect."""
