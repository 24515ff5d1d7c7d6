"""The engine: requests in, scheduled steps through the model runner, tokens out."""
