"""A Ray session that never outlives its run (the sweeps use it too): starting and joining,
placement groups, the process tree, quiet workers, the spinner."""
