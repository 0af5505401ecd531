import pytest

from llmb.plugins import load_plugins, pm


@pytest.fixture
def register_plugin():
    """Register in-memory plugin objects for one test, unregister them afterwards (llm/datasette style)."""
    load_plugins()
    names = []

    def register(plugin, name: str) -> None:
        pm.register(plugin, name=name)
        names.append(name)

    yield register
    for name in names:
        pm.unregister(name=name)
