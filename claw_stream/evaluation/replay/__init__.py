"""The held-out replay of real conversations (issue 41, item 1)."""
