"""Seeds and what they find: the swarm's draws and aims, planted bugs, a seed judged in a
worker, the fan-out over Ray, its report, and the shrinker."""
