"""Helpers the tests share: processes of the stack, event factories, stubs. No fixtures here:
those are in tests/fixtures/, registered by tests/conftest.py."""
