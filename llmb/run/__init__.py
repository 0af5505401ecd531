"""The worker side: one run end to end (plugins loaded here), sweeps, the clean room's worker, the system facts."""
