"""Reference code generated from the solution notebooks (`python -m labkit student`); do not edit."""
