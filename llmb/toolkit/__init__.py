"""What a plugin may apply to the model instance: activation checkpointing, compilers, FP8.

The shared features, offered once; plugins import these, llmb's core never imports a plugin.
"""
