"""Tools built on the library: exploring a model (`scan`, the weights and roles
tables), checking the harness against constructed models (`selftest`), and the
benchmark (`python -m harness.tools.bench`)."""
