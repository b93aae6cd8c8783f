"""A sweep's metric trajectories (`trajectory`) and its PDF report (`pdf`)."""
