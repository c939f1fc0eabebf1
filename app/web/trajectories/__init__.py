"""The trajectory pages: `/trajectories/{id}` (progress per turn, cancel, the turns, the drift and
cumulative-TTFT drawings, the verdicts) and its exports."""
