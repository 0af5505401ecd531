"""The record types' compact field lists: `python -m llmb.records`."""

from llmb.records import Commbench, Conformance, Result, SweepTrial, describe

for record_type in (Result, Conformance, Commbench, SweepTrial):
    print(f"{record_type.__name__}: `{describe(record_type)}`\n")
