"""The fixed training loop: synthetic data, torch.optim.AdamW called from Python, the device-synchronised timer, and
every variant of a step (accumulation, the distributed wrappers' steps come from llmb.distributed).
"""
