"""The run pages: the runs list, one run (verdicts, heatmaps, notes map, attention regions), its
exports (CSV, JSON, SVG, the standalone report), present mode, and comparing runs side by side."""
