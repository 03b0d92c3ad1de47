"""Real worlds for the control plane, on Ray: what the CPU and GPU backends share (common/),
each backend's own parts (cpu/, gpu/), the transfer bench (bench/) and the tasks a small model
learns (tasks/)."""
