"""Test helpers shipped with moot: a loopback fake OpenAI-compatible server."""
