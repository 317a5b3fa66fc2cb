"""claw-stream: train an agent's model from its own live conversations while it keeps serving."""

__version__ = "0.1.0"
