"""Dataset-driven episodes: tasks played through the gateway, scored by a verifiable checker."""
