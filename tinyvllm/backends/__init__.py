"""Backends: where arrays live and which code runs each operator."""
