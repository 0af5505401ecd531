"""What checks a run: the integrity guard, the dispatch and window audits, the precision audit, the dtype census,
run evidence and its digests, and the vendor libraries' releases.
"""
