"""The account pages: sign-in, sign-out, changing the password, and a run's share links."""
