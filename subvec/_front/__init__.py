"""The gymnasium contract over any backend. Imports no process or Ray module
(tests/test_rooms.py)."""
