"""The plugin registry: plugins found by entry point, loaded on demand under the integrity guard, the backends
they register. The judge reads installed plugins' metadata here, never their code.
"""
