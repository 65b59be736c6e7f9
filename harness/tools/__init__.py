"""Tools built on the library: exploring a model (`scan`, the weights and roles
tables, `explain`), and checking the harness against constructed models
(`selftest`).  The benchmarks live outside the package, in benchmarks/."""
