"""The legacy completions door (`/v1/completions`), served through chat."""
