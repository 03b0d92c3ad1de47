"""The time model against published and measured figures, and the planner: anchors, fits,
recovery and speedup rows, plan files and their search."""
