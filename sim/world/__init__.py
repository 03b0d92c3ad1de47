"""The simulated world behind miles_core/backend.py: SimPy runtime, cluster, cells, engines,
saves, a job killed whole, fault actions and the update path's cost."""
