"""The sweep pages: its permalink, progress, exports and offline report, and the notebook's Sweep panel."""
