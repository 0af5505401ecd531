"""All of llmb's terminal output: the console (text from outside printed as data, never markup) and progress bars.
The lowest layer but api and spec: every other layer may print through it.
"""
