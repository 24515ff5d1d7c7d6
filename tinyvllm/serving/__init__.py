"""Serving: the OpenAI-compatible HTTP server, its protocol and the chat loop."""
