"""`claw-stream demo`: a scripted user with a checkable preference plays episodes through the
gateway with the `openai` client, so the loop has something to learn from.

The persona (`persona.py`) wants answers under `max_words` words: it thanks the agent for a
short answer and asks for brevity after a long one, gives thumbs up or down on every answer, and
ends each episode. The metric per policy version (from `X-Claw-Weight-Version`) is the share of
short answers and the mean reward the persona gave (`tally.py`).

Those live answers come 1 to 16 per version, on whichever questions were drawn, so their
shares zig-zag (a 40-episode demo read 40%, 0%, 67%, 45%, 100%, 36%, ...). The curve to believe
is `held_out.py`'s: every version the demo serves answers the same held-out questions, never
trained, each with the same seed, and the persona's rule scores them. `run.py` plays a demo,
`report.py` draws its tables and plot.
"""
