"""check-plugin: does a plugin's setup and post-processing keep the model's function? The candidate is traced in
the clean room's worker and compared here against the FP32 reference.
"""
