"""Real worlds for the control plane: Ray actors, torch, HTTP engines (CPU now, GPU later)."""
