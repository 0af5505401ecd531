"""The record types' compact field lists: `python -m llmb.records`."""

from llmb.records import Commbench, Conformance, Result, SweepTrial, describe

if __name__ == "__main__":  # the guard imports every llmb module to watch it: printing belongs to the command only
    for record_type in (Result, Conformance, Commbench, SweepTrial):
        print(f"{record_type.__name__}: `{describe(record_type)}`\n")
