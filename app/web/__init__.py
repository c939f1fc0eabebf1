"""The web notebook: server-rendered Jinja pages and htmx fragments (see `pages.py`)."""
