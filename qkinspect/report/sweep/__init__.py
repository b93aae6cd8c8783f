"""A sweep's metric trajectories (`trajectory`), its PDF report (`pdf`) and its HTML report (`html`)."""
