"""Multi-process runs: the launch, the process group, the device mesh, what ranks agree on, the collectives'
bandwidth. Never imports the single-process runner.
"""
