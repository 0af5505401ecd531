"""The plugin API: the Backend contract, the hook, settings, errors, and the scaffold of a new plugin.

Imports no torch (`import llmb` must stay instant) and nothing of llmb outside `api` and `spec`.
"""
