"""Timing a model on this machine: its layers (`layers`) and a decode step's path beyond them (`step`)."""
