"""Trace-driven simulator over the real placement code (``iadeep sim``)."""
