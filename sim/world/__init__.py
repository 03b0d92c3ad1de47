"""The simulated world behind miles_core/backend.py, each part named as its Ray twin: SimPy
runtime, cluster, cells, engines, router, transport, placement, saves, a job killed whole,
fault actions and the update path's cost."""
