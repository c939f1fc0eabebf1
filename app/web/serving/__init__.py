"""Replaying a notebook on a vLLM server from the pages, and the replay's results."""
