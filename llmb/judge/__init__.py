"""The clean room's judge: launches the worker, reads its record, replays windows. Never imports `llmb.run`,
the worker or a plugin's code (.importlinter's judge contract).
"""
