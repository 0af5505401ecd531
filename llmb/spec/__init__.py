"""The benchmark's fixed facts that need no torch: the model's shape (and, as the tree grows, its presets,
tolerances, peak table and FLOPs). Everything may import from here; this package imports nothing of llmb's but
other torch-free leaves (names, errors), so a reader of records never pulls in torch."""
