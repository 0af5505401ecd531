"""A submission bundle's files: its layout, reading one under limits, its archive, the release manifest it is
sealed against, the code diff and the plugin's source. No torch, nothing of the run side.
"""
