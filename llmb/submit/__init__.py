"""Submissions: packaging a bundle, reproducing one, and the leaderboard of verified bundles. No torch."""
