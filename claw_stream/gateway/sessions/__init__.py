"""Who a call belongs to: keys, sessions, main lines, authorization, bounds, `/rl` routes."""
