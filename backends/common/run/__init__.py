"""The run command both real backends share: its flags, the run on Ray, its result, checkpoints
and periodic saves, checks before Ray starts, the streamed history and the plot."""
