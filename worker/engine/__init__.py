"""The kvnotes engine: notes (the KV cache a model writes at prefill), editing and composing them."""
